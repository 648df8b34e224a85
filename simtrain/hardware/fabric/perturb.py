"""A fabric with the ``whatif`` section's link perturbations: slow links, failed links, background traffic.

:class:`PerturbedFabric` wraps the fabric the engine routes over (``Topology`` or any object with its
interface) and changes only two answers:

- ``edge(u, v)``: the bandwidth times the link's factor: the ``slow_links`` factors of the link and of
  its two end vertices, times ``1 - share`` of the ``background`` entries of its link class and its tier
  (the kinds of its two ends, ``nic_leaf``); latency and class unchanged. Max-min fair sharing then gives
  this job only what the other traffic leaves (a fluid share: other jobs' flows are not simulated).
- ``route(src, dst)``: the fabric's own route unless it crosses a failed link; then the route of
  ``GraphTopology`` over the fabric graph without the failed links (shortest, widest, ECMP; never through
  a GPU vertex), so only the flows a failure hits move, as when a switch withdraws a dead port from its
  ECMP group. No such route: a ConfigError naming the failed links, the two GPUs and every GPU the
  failures cut off from the network.

Everything else (coordinates, ``cluster``, rails) is the wrapped fabric's. The fabric graph is the
wrapped fabric's ``graph`` attribute when it has one, else ``build_graph(cluster)`` (today's
rail-optimised fabric keeps no graph in memory), or one given (a link it has and the wrapped fabric
lacks, such as a second spine, takes its attributes from the graph). Failed links of class ``nvlink`` are refused: a GPU
whose NVLink is down is out of service (NCCL would not route a node's collectives around it), and the
NVLS algorithm addresses the NVSwitch directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import networkx as nx

from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.fabric.routing import GraphTopology
from simtrain.hardware.hardware import ClusterSpec, LinkClass
from simtrain.hardware.topology import EdgeAttrs, build_graph
from simtrain.spec.errors import ConfigError, Problem, problem
from simtrain.spec.whatif_spec import GPU_NAME, LINK_CLASSES, LINK_SEP, NODE_NAME, WhatIfSpec, tier_name

Edge = tuple[str, str]
_CLASS_RANK = {"nvlink": 0, "pcie": 1, "net": 2}


def gpu_name(gpu: int, gpus_per_node: int) -> str:
    """``node{n}/gpu{l} (gpu{g})``: a GPU by node and local index, and by global index."""
    return f"node{gpu // gpus_per_node}/gpu{gpu % gpus_per_node} (gpu{gpu})"


def gpu_speeds(spec: WhatIfSpec, cluster: ClusterSpec) -> dict[int, float]:
    """Speed factor of each slowed GPU (global index -> factor in (0, 1]; GPUs at full speed left out).
    A GPU named in ``slow_gpus`` on a node named in ``slow_nodes`` runs at the product of both.
    Raises ConfigError for a name outside the cluster (``check`` lists them all first)."""
    if problems := _gpu_problems(spec, cluster):
        raise ConfigError(problems)
    gpn = cluster.gpus_per_node
    out: dict[int, float] = {}
    for name, factor in spec.slow_nodes.items():
        n = int(NODE_NAME.match(name).group(1))  # type: ignore[union-attr]
        for g in range(n * gpn, (n + 1) * gpn):
            out[g] = out.get(g, 1.0) * factor
    for name, factor in spec.slow_gpus.items():
        g = _gpu_index(name, gpn)
        out[g] = out.get(g, 1.0) * factor
    return {g: f for g, f in sorted(out.items()) if f != 1.0}


def _gpu_index(name: str, gpus_per_node: int) -> int:
    m = GPU_NAME.match(name)
    assert m is not None  # the spec checked the form
    if m.group(3) is not None:
        return int(m.group(3))
    return int(m.group(1)) * gpus_per_node + int(m.group(2))


def _gpu_problems(spec: WhatIfSpec, cluster: ClusterSpec) -> list[Problem]:
    """Names of GPUs and nodes outside the cluster, and a GPU named twice."""
    gpn, nodes, gpus = cluster.gpus_per_node, cluster.n_nodes, cluster.n_gpus
    out = []
    seen: dict[int, str] = {}
    for name in spec.slow_gpus:
        m = GPU_NAME.match(name)
        assert m is not None
        if m.group(3) is not None and int(m.group(3)) >= gpus:
            out.append(problem(f"whatif.slow_gpus.{name}", name, f"a GPU of this cluster: gpu0..gpu{gpus - 1}, or "
                                                              f"node0..node{nodes - 1} / gpu0..gpu{gpn - 1}"))
            continue
        if m.group(3) is None and (int(m.group(1)) >= nodes or int(m.group(2)) >= gpn):
            out.append(problem(f"whatif.slow_gpus.{name}", name, f"a GPU of this cluster: node{{n}}/gpu{{l}} with n "
                                                              f"in 0..{nodes - 1} and l in 0..{gpn - 1}, or gpu0..gpu{gpus - 1}"))
            continue
        g = _gpu_index(name, gpn)
        if g in seen:
            out.append(problem(f"whatif.slow_gpus.{name}", name, f"a GPU named once: {seen[g]!r} names the same GPU"))
        seen[g] = name
    for name in spec.slow_nodes:
        n = int(NODE_NAME.match(name).group(1))  # type: ignore[union-attr]
        if n >= nodes:
            out.append(problem(f"whatif.slow_nodes.{name}", name, f"a node of this cluster: node0..node{nodes - 1}"))
    return out


class PerturbedFabric:
    """``base`` with the link perturbations of ``spec`` (see the module docstring).

    Args:
        base: the fabric the engine would route over (``Topology`` or a graph-backed fabric).
        cluster: the cluster it was built from.
        spec: the ``whatif`` section; its link names must have passed :func:`check`.
        graph: the fabric graph (default: ``base.graph`` if it has one, else ``build_graph(cluster)``).
    """

    def __init__(self, base: Any, cluster: ClusterSpec, spec: WhatIfSpec, graph: nx.DiGraph | None = None):
        self._base = base
        self.spec = spec
        self.graph: nx.DiGraph = graph if graph is not None else getattr(base, "graph", None) or build_graph(cluster)
        if problems := _gpu_problems(spec, cluster) + link_problems(spec, self.graph):
            raise ConfigError(problems)  # every bad name of the section at once
        self._slow_edge = {tuple(k.split(LINK_SEP)): f for k, f in spec.slow_links.items() if LINK_SEP in k}
        self._slow_vertex = {k: f for k, f in spec.slow_links.items() if LINK_SEP not in k}
        self._down: set[Edge] = set()
        for name in spec.failed_links:
            self._down.update(_links(self.graph, name))
        self._edges: dict[Edge, EdgeAttrs] = {}
        self._routes: dict[tuple[int, int], tuple[Edge, ...]] = {}
        self._cluster = cluster
        self._rerouted: GraphTopology | None = None
        """Routes over the fabric graph without the failed links (built at the first detour)."""

    @property
    def rail_symmetric(self) -> bool:
        """A perturbed fabric is never symmetric (symmetric mode's shortcuts must not apply)."""
        return False

    def __getattr__(self, name: str) -> Any:
        if name == "_base":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._base, name)

    # -- links ----------------------------------------------------------------------------------
    def factor(self, u: str, v: str) -> float:
        """Share of its nominal bandwidth the link ``u -> v`` keeps (1.0: unperturbed)."""
        f = self._slow_edge.get((u, v), 1.0) * self._slow_edge.get((v, u), 1.0)
        f *= self._slow_vertex.get(u, 1.0) * self._slow_vertex.get(v, 1.0)
        data = self.graph.edges[u, v]
        bg = self.spec.background
        f *= 1.0 - bg.get(data["link_class"], 0.0)
        f *= 1.0 - bg.get(tier_name(self.graph.nodes[u]["kind"], self.graph.nodes[v]["kind"]), 0.0)
        return f

    def edge(self, u: str, v: str) -> EdgeAttrs:
        """The wrapped fabric's edge with its bandwidth times :meth:`factor` (KeyError for a failed link)."""
        e = self._edges.get((u, v))
        if e is None:
            if (u, v) in self._down:
                raise KeyError(f"link {u!r} -> {v!r} is down (whatif.failed_links)")
            try:
                base = self._base.edge(u, v)
            except KeyError:  # a link the graph adds to the wrapped fabric (a second spine): its attributes
                if not self.graph.has_edge(u, v):
                    raise
                d = self.graph.edges[u, v]
                base = EdgeAttrs(float(d["bandwidth_Bps"]), float(d["latency_s"]), d["link_class"])
            f = self.factor(u, v)
            e = base if f == 1.0 else EdgeAttrs(base.bandwidth_Bps * f, base.latency_s, base.link_class)
            self._edges[(u, v)] = e
        return e

    def path_latency_s(self, path: tuple[Edge, ...]) -> float:
        """Sum of the edge latencies along ``path`` (seconds)."""
        return sum(self.edge(u, v).latency_s for u, v in path)

    def path_bandwidth_Bps(self, path: tuple[Edge, ...]) -> float:
        """Bottleneck bandwidth (bytes/s) along ``path``, perturbed; inf for an empty path."""
        return min((self.edge(u, v).bandwidth_Bps for u, v in path), default=math.inf)

    def link_class_of(self, path: tuple[Edge, ...]) -> LinkClass:
        """The slowest link class on ``path`` ("net" > "pcie" > "nvlink"; "nvlink" when empty)."""
        best: LinkClass = "nvlink"
        for u, v in path:
            cls = self.edge(u, v).link_class
            if _CLASS_RANK[cls] > _CLASS_RANK[best]:
                best = cls
        return best

    # -- routes ---------------------------------------------------------------------------------
    def route(self, src: int, dst: int) -> tuple[Edge, ...]:
        """The wrapped fabric's route, or a detour around the failed links (module docstring)."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._base.route(src, dst)
            if self._down and any(e in self._down for e in r):
                r = self._detour(src, dst)
            self._routes[key] = r
        return r

    def _detour(self, src: int, dst: int) -> tuple[Edge, ...]:
        if self._rerouted is None:
            intact = self.graph.copy()
            intact.remove_edges_from(self._down)
            self._rerouted = GraphTopology(intact, self._cluster)
        try:
            return self._rerouted.route(src, dst)
        except ConfigError:  # no route transiting no GPU: name the failures and what they cut off
            raise ConfigError(self._cut_off(src, dst)) from None

    def _cut_off(self, src: int, dst: int) -> Problem:
        gpn = self._base.gpus_per_node
        lost = cut_off_gpus(self.graph, self._down)
        names = ", ".join(gpu_name(g, gpn) for g in lost[:16]) + (f" and {len(lost) - 16} more" if len(lost) > 16 else "")
        return Problem("whatif.failed_links", f"{list(self.spec.failed_links)!r} leave no route from "
                       f"{gpu_name(src, gpn)} to {gpu_name(dst, gpn)}, which this run's communication needs; "
                       f"GPUs cut off from the network: {names or 'none (the two are in parts the failures split)'}; "
                       "fail fewer links, or choose ones the fabric has a detour for")


def cut_off_gpus(graph: nx.DiGraph, down: set[Edge]) -> list[int]:
    """GPUs (global indices) with no path, avoiding ``down`` and transiting no GPU, to the part of the
    fabric most GPUs reach (the network), in index order."""
    g = nx.Graph()
    gpus: list[str] = []
    for v, data in graph.nodes(data=True):
        if data["kind"] == "gpu":
            gpus.append(v)
        else:
            g.add_node(v)
    g.add_edges_from((u, v) for u, v in graph.edges if (u, v) not in down and u in g and v in g)
    comp = {v: i for i, c in enumerate(nx.connected_components(g)) for v in c}
    reach: dict[str, set[int]] = {}
    count: dict[int, int] = {}
    for x in gpus:
        reach[x] = {comp[v] for v in graph.successors(x) if v in comp and (x, v) not in down}
        for c in reach[x]:
            count[c] = count.get(c, 0) + 1
    if not count:
        return sorted(int(x[3:]) for x in gpus)
    main = max(count, key=lambda c: (count[c], -c))
    return sorted(int(x[3:]) for x in gpus if main not in reach[x])


def _links(graph: nx.DiGraph, name: str) -> list[Edge]:
    """The directed edges a link name stands for: ``u->v`` both directions, a vertex all its edges."""
    if LINK_SEP in name:
        u, v = name.split(LINK_SEP)
        return [e for e in ((u, v), (v, u)) if graph.has_edge(*e)]
    return [*graph.out_edges(name), *graph.in_edges(name)]


def link_problems(spec: WhatIfSpec, graph: nx.DiGraph) -> list[Problem]:
    """Link, vertex and tier names of ``spec`` the fabric graph does not have, and failed NVLinks."""
    out = []
    for field, names in (("slow_links", spec.slow_links), ("failed_links", spec.failed_links)):
        for name in names:
            path = f"whatif.{field}.{name}" if field == "slow_links" else f"whatif.{field}"
            if LINK_SEP in name:
                u, v = name.split(LINK_SEP)
                if not (graph.has_edge(u, v) or graph.has_edge(v, u)):
                    out.append(problem(path, name, f"a link of this fabric: {_near(graph, u)}"))
                    continue
            elif name not in graph:
                out.append(problem(path, name, f"a vertex of this fabric ({_vertex_ranges(graph)})"))
                continue
            if field == "failed_links" and any(graph.edges[e]["link_class"] == "nvlink" for e in _links(graph, name)):
                out.append(problem(path, name, "a network or PCIe link or vertex: a failed NVLink takes its GPU out "
                                               "of service (not simulated); slow it down with whatif.slow_links"))
    tiers = sorted({tier_name(graph.nodes[u]["kind"], graph.nodes[v]["kind"]) for u, v in graph.edges})
    for name in spec.background:
        if name not in LINK_CLASSES and name not in tiers:
            out.append(problem(f"whatif.background.{name}", name, f"a tier of this fabric ({', '.join(tiers)}) or a "
                                                                  f"link class ({', '.join(LINK_CLASSES)})"))
    return out


def _near(graph: nx.DiGraph, u: str) -> str:
    """What a user may write instead of a link that does not exist: the links at ``u``, or the vertices."""
    if u in graph:
        peers = sorted(graph.successors(u))
        shown = ", ".join(f"{u}->{v}" for v in peers[:8]) + (", ..." if len(peers) > 8 else "")
        return f"{u}'s links are {shown}"
    return f"no vertex {u!r} ({_vertex_ranges(graph)})"


def _vertex_ranges(graph: nx.DiGraph) -> str:
    """The fabric's vertices by kind, first and last name of each (``nic: nic0.0 .. nic7.7``)."""
    by_kind: dict[str, list[str]] = {}
    for v, data in graph.nodes(data=True):
        by_kind.setdefault(data["kind"], []).append(v)
    return "; ".join(f"{k}: {vs[0]}" + (f" .. {vs[-1]}" if len(vs) > 1 else "") for k, vs in by_kind.items())


def perturb(base: Fabric, cluster: ClusterSpec, spec: WhatIfSpec) -> Fabric:
    """``base`` wrapped in a :class:`PerturbedFabric` when ``spec`` perturbs a link, else ``base`` itself."""
    if not (spec.slow_links or spec.failed_links or any(s > 0 for s in spec.background.values())):
        return base
    return PerturbedFabric(base, cluster, spec)  # type: ignore[return-value]


def iter_names(spec: WhatIfSpec) -> Iterable[str]:
    """Every perturbation of ``spec`` in words, for notes."""
    for k, f in spec.slow_gpus.items():
        yield f"GPU {k} at {f:g}x speed"
    for k, f in spec.slow_nodes.items():
        yield f"{k} (all its GPUs) at {f:g}x speed"
    for k, f in spec.slow_links.items():
        yield f"link {k} at {f:g}x bandwidth"
    for k in spec.failed_links:
        yield f"link {k} down"
    for k, s in spec.background.items():
        yield f"{100 * s:g} % of {k} bandwidth taken by other traffic"
