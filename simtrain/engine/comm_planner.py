"""Planning communication for the engine: each collective's or send's algorithm, latency and flow phases per
rank group (memoised by signature), route caching, and the symmetry checks that let one representative
group stand for all (the symmetric mode)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from simtrain.cost.collectives import (
    Candidate,
    Flow,
    Plan,
    choose_plan,
    collective_candidates,
    effective_bandwidth,
    plan_send,
    unit_idle_times,
)
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.ops import (
    CommOp,
)
from simtrain.plan.layout import RankGrid, place
from simtrain.plan.roles import tiles
from simtrain.spec.collective_kinds import SEND, Collective

#: Link class of a pipeline send/recv: its interference with compute differs from a collective's.
P2P_CLASS = "p2p"


class _RouteCache:
    """A Topology whose routes are memoised (routes are pure functions of the endpoints)."""

    def __init__(self, topo: Fabric):
        self._topo = topo
        self._routes: dict[tuple[int, int], Any] = {}
        self.rail_symmetric = topo.rail_symmetric  # asked per group and flow list: no __getattr__ detour

    def route(self, src: int, dst: int) -> Any:
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self._topo.route(src, dst)
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._topo, name)


class CommPlanner:
    """Plans collectives and sends for simulated ranks, with symmetric weights where needed."""

    def __init__(self, topo: Fabric, gpu: GpuSpec, grid: RankGrid, symmetric: bool):
        self.topo: Fabric = _RouteCache(topo)  # type: ignore[assignment]
        self.gpu, self.grid, self.symmetric = gpu, grid, symmetric
        self._weights: dict[Any, list[list[tuple[float, ...]]]] = {}
        self.plans: dict[Any, Plan] = {}
        self._caps: dict[Any, float] = {}
        self._cache: dict[Any, tuple[float, list[list[tuple[Any, ...]]], str]] = {}
        self._stage_groups: dict[tuple[str, int], list[tuple[int, ...]]] = {}
        self._candidates: dict[tuple[Collective, tuple[int, ...]], tuple[Candidate, ...]] = {}
        self._idle: dict[tuple[Collective, tuple[int, ...]], tuple[float, ...]] = {}

    def capacity(self, e: Any) -> float:
        """Achievable bandwidth of edge ``e`` (cached)."""
        c = self._caps.get(e)
        if c is None:
            c = self._caps[e] = effective_bandwidth(self.topo, self.gpu, e)
        return c

    def _plan(self, coll: Collective, group: tuple[int, ...], size: float, choice: tuple[str, str] | None = None) -> Plan:
        key = (coll, group, size)
        plan = self.plans.get(key)
        if plan is None:
            ckey = (coll, group)
            cands = self._candidates.get(ckey)
            if cands is None:
                cands = self._candidates[ckey] = collective_candidates(coll, tuple(place(r) for r in group),
                                                                       self.topo, self.gpu)
            idle = None
            if choice is None:
                idle = self._idle.get(ckey)
                if idle is None:
                    idle = self._idle[ckey] = unit_idle_times(cands, self.capacity)
            plan = choose_plan(cands, idle, size, choice)
            if choice is None:
                self.plans[key] = plan
        return plan

    def _sharing_groups(self, plan: Plan, group: tuple[int, ...], axis: str, stage: int) -> list[tuple[int, ...]]:
        """Groups of the stage whose flows can share an edge with ``group``'s (``_may_share``)."""
        groups = self._groups_in_stage(axis, stage)
        net = any(self.topo.link_class_of(f.path) == "net" for ph in plan.phases for f in ph)
        rails = {self.topo.rail_of(place(r)) for r in group}
        return [g for g in groups if g == group or _may_share(self.topo, net, rails, g)]

    def _groups_in_stage(self, axis: str, stage: int) -> list[tuple[int, ...]]:
        key = (axis, stage)
        if key not in self._stage_groups:
            self._stage_groups[key] = self.grid.stage_groups(axis, stage)
        return self._stage_groups[key]

    def collective(self, op: CommOp, rank: int, stage: int) -> tuple[float, list[list[tuple[Any, ...]]], str]:
        """(latency, phases of flows as FlowNetwork tuples, link class) for ``rank``'s op."""
        assert op.coll is not None, f"collective op {op.name} without its Collective"
        # symmetric: keyed by the representative (one per stage and role, ``simtrain.plan.roles``)
        key = (op.coll, op.axis, op.comm_bytes, rank if self.symmetric else self.grid.group(op.axis, rank))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        group = self.grid.group(op.axis, rank)
        if self.symmetric and stage > 0 and (shift := self._translation(op.axis, rank, group)) is not None:
            base = self.collective(op, self._counterpart(rank, 0), 0)
            out = (base[0], [[_shift_flow(f, *shift) for f in ph] for ph in base[1]], base[2])
            self._cache[key] = out
            return out
        plan = self._plan(op.coll, group, op.comm_bytes)
        # A group with unequal member counts on its nodes (one that does not tile the NVLink domains)
        # runs a plain ring whose members do different things (only the boundary ones cross the
        # network): its time is its slowest flow's, so a representative carries the whole group's flows.
        # On a general graph (not rail-symmetric) the same holds when some member's flows see a bottleneck
        # the representative's own do not (a tier only some of them cross, such as an inter-site link).
        whole = self.symmetric and (not tiles(self.topo, group) or (
            not self.topo.rail_symmetric and not _stands_for(self.topo, plan.phases, plan.for_source(place(rank)))))
        if not self.symmetric:
            phases = [[(f.path, (1.0,) * len(f.path), f.nbytes, f.cap_Bps) for f in ph] for ph in plan.phases]
        else:
            # Which edges the symmetric copies share does not depend on the size: cache the weights.
            mine = plan.phases if whole else plan.for_source(place(rank))
            wkey = (op.coll, op.axis, rank, plan.algorithm, plan.protocol)
            weights = self._weights.get(wkey)
            if weights is None:
                choice = (plan.algorithm, plan.protocol)
                peers = [plan if g == group else self._plan(op.coll, g, op.comm_bytes, choice)
                         for g in self._sharing_groups(plan, group, op.axis, stage)]
                weights = self._weights[wkey] = [[w for _, w, _, _ in ph]
                                                 for ph in _weighted(mine, [p.phases for p in peers])]
            phases = [[(f.path, w, f.nbytes, f.cap_Bps) for f, w in zip(ph, wph, strict=True)]
                      for ph, wph in zip(mine, weights, strict=True)]
        if self.symmetric and not whole:
            phases = [self._localise(ph, place(rank)) for ph in phases]
        phases = [_bundle(ph) for ph in phases]
        out = (plan.latency_s, phases, _link_class(self.topo, plan.phases))
        self._cache[key] = out
        return out

    def send(self, op: CommOp, rank: int, stage: int, dst_rank: int) -> tuple[float, list[list[tuple[Any, ...]]], str]:
        """A pipeline send from ``rank`` to ``dst_rank`` (symmetric: weighted by the whole stage)."""
        key = (SEND, op.comm_bytes, rank, dst_rank)  # symmetric: rank is the stage's representative
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        plan = plan_send(place(rank), place(dst_rank), op.comm_bytes, self.topo)
        if self.symmetric:
            dst_stage = self.grid.stage_of(dst_rank)
            route, topo = self.topo.route, self.topo
            net = topo.link_class_of(plan.phases[0][0].path) == "net"
            rails = {topo.rail_of(place(rank)), topo.rail_of(place(dst_rank))}
            pairs = [(r, self._counterpart(r, dst_stage)) for r in self.grid.stage_ranks(stage)]
            peers = [((Flow(place(r), route(place(r), place(d)), op.comm_bytes),),)
                     for r, d in pairs if r == rank or _may_share(topo, net, rails, (r, d))]
            phases = [self._localise(ph, place(rank)) for ph in _weighted(plan.phases, peers)]
        else:
            phases = [[(f.path, (1.0,) * len(f.path), f.nbytes, f.cap_Bps) for f in ph] for ph in plan.phases]
        out = (plan.latency_s, phases, P2P_CLASS)
        self._cache[key] = out
        return out

    def _translation(self, axis: str, rank: int, group: tuple[int, ...]) -> tuple[int, int, int] | None:
        """(GPU, node, leaf-group) offsets that map stage 0's representative and group onto ``rank``'s,
        when the fabric looks the same from both: whole leaf groups apart, every leaf group full, and
        the group a translate of stage 0's. Stages of a pipeline usually are (pp outermost), so their
        symmetric-mode flows are stage 0's, renamed (``_shift_flow``), instead of planned again."""
        topo = self.topo
        if not topo.rail_symmetric:  # no renaming on a general graph: every stage is planned over it
            return None
        base = self._counterpart(rank, 0)
        dg = place(rank) - place(base)
        per_leaf = topo.gpus_per_node * topo.nodes_per_leaf
        if dg % per_leaf or topo.n_nodes % topo.nodes_per_leaf:
            return None
        if tuple(place(r) - dg for r in group) != tuple(place(r) for r in self.grid.group(axis, base)):
            return None
        dn = dg // topo.gpus_per_node
        return dg, dn, dn // topo.nodes_per_leaf

    def _localise(self, flows: list[tuple[Any, ...]], gpu: int) -> list[tuple[Any, ...]]:
        """Symmetric mode: keep, of the representative's flows, the edges at its own GPU, NIC and leaf
        switch. Every rank of the stage sends and receives the same traffic, so a remote GPU's or
        NIC's edges carry what the representative's own edges carry (the same capacities, duplex
        links): they add no constraint, only work for the fluid model. On a fabric that is not
        rail-symmetric (a general graph: tiers above the leaf, planes, sites) the flows keep every edge,
        each weighted by the copies on it, so every tier the routes cross constrains them."""
        topo = self.topo
        if not topo.rail_symmetric:
            return flows
        node, rail = topo.node_of(gpu), topo.rail_of(gpu)
        mine = {f"gpu{gpu}", f"nic{node}.{rail}", f"leaf{rail}.{topo.leaf_group_of_node(node)}"}
        out = []
        for path, w, nbytes, cap in flows:
            keep = [(e, x) for e, x in zip(path, w, strict=True) if e[0] in mine or e[1] in mine]
            if keep:
                out.append((tuple(e for e, _ in keep), tuple(x for _, x in keep), nbytes, cap))
        return out

    def _counterpart(self, rank: int, stage: int) -> int:
        """The rank with ``rank``'s coordinates on pipeline stage ``stage``."""
        return rank + (stage - self.grid.stage_of(rank)) * self.grid.stride("pp")


def symmetry_violation(grid: RankGrid, topo: Fabric) -> str | None:
    """Why the ranks of some pipeline stage are not interchangeable on the fabric (None if they are).

    Symmetric mode simulates one rank per stage, which is exact when every node hosting a stage holds
    the same number of its ranks and every group of an axis has the same member count on each of its
    nodes (e.g. dp=12 on 8-GPU nodes breaks it: one node holds 8 ranks of the group, the next 4).
    """
    for s in range(grid.layout.pp):
        per_node = Counter(topo.node_of(place(r)) for r in grid.stage_ranks(s))
        if len(set(per_node.values())) > 1:
            return (f"stage {s} has {min(per_node.values())} ranks on some nodes and {max(per_node.values())} "
                    "on others")
        for axis in ("tp", "cp", "dp"):
            if getattr(grid.layout, axis) == 1:
                continue
            shapes = {tuple(sorted(Counter(topo.node_of(place(r)) for r in g).values()))
                      for g in grid.stage_groups(axis, s)}
            if len(shapes) > 1:
                return f"the {axis} groups of stage {s} are spread over nodes unevenly"
            if len(set(next(iter(shapes)))) > 1:
                return f"a {axis} group of stage {s} has more members on some nodes than on others"
    return None


def _shift_vertex(v: str, dg: int, dn: int, dk: int) -> str:
    """Vertex ``v`` (Topology naming) moved by dg GPUs, dn nodes and dk leaf groups."""
    if v.startswith("gpu"):
        return f"gpu{int(v[3:]) + dg}"
    if v.startswith("nvsw"):
        return f"nvsw{int(v[4:]) + dn}"
    if v.startswith("nic"):
        n, j = v[3:].split(".")
        return f"nic{int(n) + dn}.{j}"
    if v.startswith("leaf"):
        j, k = v[4:].split(".")
        return f"leaf{j}.{int(k) + dk}"
    return v  # the spine


def _shift_flow(flow: tuple[Any, ...], dg: int, dn: int, dk: int) -> tuple[Any, ...]:
    path, w, nbytes, cap = flow
    return (tuple((_shift_vertex(a, dg, dn, dk), _shift_vertex(b, dg, dn, dk)) for a, b in path), w, nbytes, cap)


def _bundle(flows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Merge one phase's flows that carry the same bytes at the same cap into a single flow each (an
    all-to-all's p-1 flows, NVLS up/down, a node-limited all-to-all's network and NVLink sets): started
    together, max-min fairness gives each the rate of its bottleneck, and they end when the slowest
    ends, which is the merged flow's time at rate min over edges of capacity / (flows on the edge);
    one flow instead of p-1 keeps the fluid model's rebalancing cheap. Per-edge weights add up."""
    if len(flows) < 2:
        return flows
    classes: dict[tuple[float, float], dict[Any, float]] = {}
    for path, w, nbytes, cap in flows:
        weight = classes.setdefault((nbytes, cap), {})
        for e, x in zip(path, w, strict=True):
            weight[e] = weight.get(e, 0.0) + x
    if len(classes) == len(flows):
        return flows
    return [(tuple(weight), tuple(weight.values()), nbytes, cap) for (nbytes, cap), weight in classes.items()]


def _may_share(topo: Fabric, net: bool, rails: set[int], ranks: tuple[int, ...]) -> bool:
    """Whether flows of ``ranks`` can share an edge with flows that use ``rails`` (``net``: over the network).

    In the Topology's fabric NVLink, NVLS and PCIe edges belong to one GPU (NVSwitch star) or one GPU
    pair (mesh), so disjoint groups never share them; NIC, leaf and spine edges belong to one rail.
    Two disjoint groups can therefore share an edge only over the network, on a common rail. On a
    general graph (not rail-symmetric) any two groups may share one: all of them are counted.
    """
    if not topo.rail_symmetric:
        return True
    return net and any(topo.rail_of(place(r)) in rails for r in ranks)


def _stands_for(topo: Fabric, phases: Sequence[Sequence[Flow]], mine: Sequence[Sequence[Flow]]) -> bool:
    """Whether, in every phase, the representative's own flows meet every (bottleneck bandwidth, path
    latency) that the group's flows meet, so its flows stand for the group's."""
    def kinds(flows: Sequence[Flow]) -> set[tuple[float, float]]:
        return {(topo.path_bandwidth_Bps(f.path), topo.path_latency_s(f.path)) for f in flows}
    return all(kinds(ph) == kinds(m) for ph, m in zip(phases, mine, strict=True))


def _link_class(topo: Fabric, phases: tuple[tuple[Flow, ...], ...]) -> str:
    for ph in phases:
        for f in ph:
            if topo.link_class_of(f.path) == "net":
                return "net"
    return "nvlink"


def _weighted(mine: tuple[tuple[Flow, ...], ...], all_groups: Sequence[Sequence[Sequence[Flow]]]
              ) -> list[list[tuple[Any, ...]]]:
    """Give each of the representative's flows, per edge, the count of symmetric copies on it."""
    out = []
    for i, ph in enumerate(mine):
        total: dict[Any, int] = defaultdict(int)
        for phases in all_groups:
            for f in phases[i]:
                for e in f.path:
                    total[e] += 1
        own: dict[Any, int] = defaultdict(int)
        for f in ph:
            for e in f.path:
                own[e] += 1
        out.append([(f.path, tuple(total[e] / own[e] for e in f.path), f.nbytes, f.cap_Bps) for f in ph])
    return out
