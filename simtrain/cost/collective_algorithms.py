"""The registry of collective algorithms NCCL (and a calibrated profile) can run, one class each.

An algorithm says whether it ``applies`` to a collective on a group and offers ``candidates`` there.
Most are a :class:`FlowAlgorithm`: its ``phases`` of flows for a 1-byte collective (every flow scales
linearly with the size), its ``latency_s`` per protocol and its protocols' wire factors, one
:class:`Candidate` per protocol.
``collectives.collective_candidates`` asks every registered algorithm, in registry order (ties in
predicted time go to the earlier candidate, as before). Adding an algorithm is a class here plus a
line in :data:`ALGORITHMS`. Algorithms (reference Table B, B2):

- ring: each GPU sends 2(p-1)/p*S (all-reduce) or (p-1)/p*S (all-gather/reduce-scatter) to its ring
  successor, with NCCL's rotated multi-channel rings across nodes (``collective_flows.ring_flows``).
- tree (all-reduce, several nodes): the ring's traffic at NCCL's tree derate (x0.92, x0.85 for the
  TREE pattern) with log-depth latency.
- hier2d (all-reduce over m nodes x k GPUs): reduce-scatter in the node, all-reduce S/k across nodes
  on each rail, all-gather in the node (Table B "Hierarchical (2D)").
- nvls (all-reduce in one NVSwitch node, p >= nvls_min_gpus): each GPU sends S to the switch and
  receives S back at the calibrated NVLS algbw (note 1: t = a + S/B_nvls_alg).
- pairwise all-to-all: S/p to every peer; node_limited: the deduplicated MoE all-to-all (DeepEP).
- p2p: the ring shift of ring attention, every GPU sends S to the next one.
- measured: a calibrated profile's measured curve for the group, which replaces the others.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from simtrain.cost.collective_flows import (
    BASE_LAT_US,
    INTER_LAT_US,
    INTRA_LAT_US,
    PROTOCOLS,
    TREE_DERATE,
    US,
    WIRE_FACTOR,
    Candidate,
    Flow,
    MeasuredCandidate,
    Phases,
    nodes_of,
    ring_flows,
    ring_latency,
    route_flow,
    tree_latency,
)
from simtrain.hardware.calibrated import CollectiveTable
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import GpuSpec
from simtrain.spec.collective_kinds import Collective, CollectiveKind

K = CollectiveKind
UNIT = 1.0  # candidates are planned for a 1-byte collective (Candidate.phases scales them)


@dataclass(slots=True)
class Group:
    """A communicator's GPUs as the algorithms see them.

    Attributes:
        gpus: the GPUs in rank order.
        by_node: the GPUs by node (``collective_flows.nodes_of``).
        net_lat_s: network latency across nodes, seconds (two switch hops; 0 within a node), plus, on a
            general graph, the wire latency its links add beyond a switch hop (``_wire_latency_s``).
    """

    gpus: tuple[int, ...]
    by_node: dict[int, list[int]]
    net_lat_s: float
    _memo: dict[str, Phases] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, topo: Fabric, gpus: tuple[int, ...]) -> Group:
        """The group ``gpus`` on ``topo``."""
        by_node = nodes_of(topo, gpus)
        lat = topo.cluster.net_hop_latency_s * 2 if len(by_node) > 1 else 0.0
        if len(by_node) > 1 and not topo.rail_symmetric:
            lat += _wire_latency_s(topo, [g[0] for g in by_node.values()])
        return cls(gpus, by_node, lat)

    @property
    def p(self) -> int:
        """Ranks in the group."""
        return len(self.gpus)

    @property
    def n_nodes(self) -> int:
        """Nodes the group spans."""
        return len(self.by_node)

    @property
    def per_node(self) -> int:
        """GPUs of the group on its first node."""
        return len(next(iter(self.by_node.values())))

    @property
    def regular(self) -> bool:
        """Whether every node holds the same number of the group's GPUs."""
        k = self.per_node
        return all(len(v) == k for v in self.by_node.values())

    def shared(self, key: str, build: Callable[[], Phases]) -> Phases:
        """Phases built once per group: algorithms and protocols that share flows share one object, whose
        idle-network time ``collectives.unit_idle_times`` then computes once."""
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = build()
        return out


def _wire_latency_s(topo: Fabric, firsts: list[int]) -> float:
    """The largest latency, seconds, that the routes between consecutive nodes of a ring (``firsts``: one
    GPU per node, in ring order) add beyond one switch hop per network link: the propagation delay of a
    long link (an inter-site fibre at about 5 us/km). NCCL's latency model counts switch hops only
    (tuning.cc's per-hop constants); a graph's longer links add their own delay to every ring step."""
    hop = topo.cluster.net_hop_latency_s
    worst = 0.0
    for a, b in zip(firsts, firsts[1:] + firsts[:1], strict=True):
        extra = sum(max(0.0, e.latency_s - hop) for e in (topo.edge(u, v) for u, v in topo.route(a, b))
                    if e.link_class == "net")
        worst = max(worst, extra)
    return worst


class CollectiveAlgorithm(ABC):
    """One algorithm of the registry: where it applies and the candidates it offers there."""

    name: ClassVar[str]
    replaces_others: ClassVar[bool] = False
    """When it yields candidates, they are the only ones (a measured curve stands for NCCL's choice)."""

    @abstractmethod
    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        """Whether this algorithm can run ``coll`` on ``group`` (of at least 2 GPUs)."""

    @abstractmethod
    def candidates(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec,
                   others: tuple[Candidate, ...]) -> tuple[Candidate, ...]:
        """Its (protocol) candidates for ``coll`` on ``group``, planned for a 1-byte collective
        (``others``: the candidates of the algorithms that do not replace others, for one that does)."""


class FlowAlgorithm(CollectiveAlgorithm):
    """An algorithm given by its flows and NCCL's latency formula, one candidate per protocol."""

    protocols: ClassVar[tuple[str, ...]] = ("Simple",)

    @abstractmethod
    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        """The flows of a 1-byte collective, phase by phase."""

    @abstractmethod
    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        """Fixed time of the collective under ``protocol``, seconds (NCCL's tuning model)."""

    def wire_factor(self, protocol: str) -> float:
        """Bytes on the wire per byte of flow under ``protocol``."""
        return WIRE_FACTOR[protocol]

    def candidates(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec,
                   others: tuple[Candidate, ...]) -> tuple[Candidate, ...]:
        """One candidate per protocol, all sharing one set of phases."""
        phases = self.phases(coll, group, topo, gpu)
        return tuple(Candidate(self.name, proto, self.latency_s(coll, group, proto), phases, self.wire_factor(proto))
                     for proto in self.protocols)


def _pairwise(topo: Fabric, group: Group) -> Phases:
    gpus, p = group.gpus, group.p
    return (tuple(route_flow(topo, g, h, UNIT / p) for g in gpus for h in gpus if g != h),)


def _a2a_latency(group: Group) -> float:
    return ring_latency(K.ALL_TO_ALL, group.p, group.n_nodes, "Simple", "ring", group.net_lat_s)


class RingShift(FlowAlgorithm):
    """Ring attention's KV exchange: every GPU sends its block to the next rank (P2P send/recv pairs,
    Megatron-core p2p context parallelism), at a point-to-point latency (``collectives.plan_send``)."""

    name = "p2p"

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return coll.kind is K.RING_SHIFT

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        gpus, p = group.gpus, group.p
        return (tuple(route_flow(topo, g, gpus[(i + 1) % p], UNIT) for i, g in enumerate(gpus)),)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        hop = (INTER_LAT_US["ring"]["Simple"] * US + group.net_lat_s if group.n_nodes > 1
               else INTRA_LAT_US["ring"]["Simple"] * US)
        return BASE_LAT_US["ring"]["Simple"] * US + hop


class Pairwise(FlowAlgorithm):
    """All-to-all: S/p from every GPU to every peer (also the deduplicated all-to-all on one node or on
    nodes holding unequal parts of the group, where there is nothing to deduplicate)."""

    name = "pairwise"

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return coll.kind is K.ALL_TO_ALL and not NodeLimitedA2A.fits(coll, group)

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        return _pairwise(topo, group)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        return _a2a_latency(group)


def node_hit_probability(n_nodes: int, k: int, n_experts: int, m_nodes: int = 0) -> float:
    """Probability that a token's top-``k`` experts include one on a given node, with ``n_experts`` spread
    evenly over ``n_nodes`` and routing balanced: ``m_nodes/n_nodes`` when routing is limited to
    ``m_nodes`` nodes (DeepSeek-V3 sec. 3.2.2), else 1 - C(E - E/N, k) / C(E, k) (none of the k experts,
    drawn without replacement, is among that node's E/N)."""
    if m_nodes:
        return min(m_nodes, n_nodes, k) / n_nodes
    others = n_experts - n_experts // n_nodes
    return 1.0 - math.comb(others, k) / math.comb(n_experts, k) if k <= n_experts else 1.0


class NodeLimitedA2A(FlowAlgorithm):
    """All-to-all of S bytes per GPU (k copies of each token, ``NodeLimited`` options) that crosses the
    network once per remote node a token is routed to, to the rail peer, which forwards its copies over
    NVLink (DeepEP's internode kernels; HybridEP likewise). Per GPU: S/k x P(node hit) to each remote
    rail peer (``node_hit_probability``), and S/L to each of the other L-1 GPUs of its node,
    concurrently (IB and NVLink are disjoint links)."""

    name = "node_limited"

    @staticmethod
    def fits(coll: Collective, group: Group) -> bool:
        """A deduplicated all-to-all over several nodes holding equal parts of the group."""
        return coll.node_limited is not None and group.n_nodes > 1 and group.regular

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return coll.kind is K.ALL_TO_ALL and self.fits(coll, group)

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        opts = coll.node_limited
        assert opts is not None
        nodes = list(group.by_node.values())
        local = len(nodes[0])
        ib = UNIT / opts.top_k * node_hit_probability(len(nodes), opts.top_k, opts.n_experts, opts.max_nodes)
        flows: list[Flow] = []
        for ni, node in enumerate(nodes):
            for j, g in enumerate(node):
                flows += [route_flow(topo, g, other[j], ib) for nj, other in enumerate(nodes) if nj != ni]
                flows += [route_flow(topo, g, h, UNIT / local) for h in node if h != g]
        return (tuple(flows),)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        return _a2a_latency(group)


def _ring_phases(coll: Collective, group: Group, topo: Fabric) -> Phases:
    p = group.p
    per_gpu = (2.0 if coll.kind is K.ALL_REDUCE else 1.0) * (p - 1) / p * UNIT
    return group.shared("ring", lambda: (ring_flows(topo, group.gpus, per_gpu),))


class Ring(FlowAlgorithm):
    """NCCL's ring for all-reduce, all-gather and reduce-scatter, in every protocol."""

    name = "ring"
    protocols = PROTOCOLS

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return coll.kind in (K.ALL_REDUCE, K.ALL_GATHER, K.REDUCE_SCATTER)

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        return _ring_phases(coll, group, topo)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        return ring_latency(coll.kind, group.p, group.n_nodes, protocol, "ring", group.net_lat_s)


class Tree(FlowAlgorithm):
    """NCCL's tree all-reduce across nodes: the ring's traffic at the tree derate, log-depth latency."""

    name = "tree"
    protocols = PROTOCOLS

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return coll.kind is K.ALL_REDUCE and group.n_nodes > 1

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        return _ring_phases(coll, group, topo)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        return tree_latency(group.p, group.n_nodes, protocol, group.net_lat_s)

    def wire_factor(self, protocol: str) -> float:
        return WIRE_FACTOR[protocol] / TREE_DERATE


class Hierarchical2D(FlowAlgorithm):
    """All-reduce over m nodes x k GPUs: reduce-scatter in the node, all-reduce S/k across nodes on each
    rail, all-gather in the node (Table B "Hierarchical (2D)")."""

    name = "hier2d"

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return coll.kind is K.ALL_REDUCE and group.n_nodes > 1 and group.per_node > 1 and group.regular

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        nodes = list(group.by_node.values())
        k, m = len(nodes[0]), len(nodes)
        intra = tuple(f for local in nodes for f in ring_flows(topo, tuple(local), (k - 1) / k * UNIT))
        inter = tuple(f for j in range(k) for f in ring_flows(topo, tuple(n[j] for n in nodes),
                                                              2.0 * (m - 1) / m * UNIT / k))
        return (intra, inter, intra)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        k, m = group.per_node, group.n_nodes
        return (ring_latency(K.REDUCE_SCATTER, k, 1, "Simple", "ring", 0.0) * 2
                + ring_latency(K.ALL_REDUCE, m, m, "Simple", "ring", group.net_lat_s))


class Nvls(FlowAlgorithm):
    """NVLink SHARP all-reduce in one NVSwitch node: each GPU sends S to the switch and gets S back at
    the calibrated NVLS algbw (reference note 1)."""

    name = "nvls"

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        return (coll.kind is K.ALL_REDUCE and group.n_nodes == 1
                and topo.nvswitch_of(topo.node_of(group.gpus[0])) is not None
                and gpu.has_nvls and group.p >= gpu.nvls_min_gpus)

    def phases(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> Phases:
        sw = topo.nvswitch_of(topo.node_of(group.gpus[0]))
        assert sw is not None, "NVLS applies only to an NVSwitch node"
        up = tuple(Flow(g, ((f"gpu{g}", sw),), UNIT, gpu.nvls_algbw_Bps) for g in group.gpus)
        down = tuple(Flow(g, ((sw, f"gpu{g}"),), UNIT, gpu.nvls_algbw_Bps) for g in group.gpus)
        return (up + down,)

    def latency_s(self, coll: Collective, group: Group, protocol: str) -> float:
        return (BASE_LAT_US["nvls"]["Simple"] + INTRA_LAT_US["nvls"]["Simple"]) * US


class MeasuredTable(CollectiveAlgorithm):
    """A calibrated profile's measured curve for (kind, ranks, nodes) (``MeasuredCandidate``): the
    default Simple-protocol flows of the ring, pairwise or p2p algorithm, rate-capped to the measured
    time. Only for option-free collectives: the calibration times the plain ``torch.distributed`` ones."""

    name = "measured"
    replaces_others = True
    _BASES: ClassVar[tuple[str, ...]] = ("ring", "pairwise", "p2p")

    @staticmethod
    def _table(gpu: GpuSpec) -> CollectiveTable | None:
        table = getattr(gpu, "collectives", None)  # a CalibratedGpuSpec (simtrain.hardware.profile)
        return table if isinstance(table, CollectiveTable) else None

    def applies(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec) -> bool:
        table = self._table(gpu)
        return coll.options is None and table is not None and (coll.kind, group.p, group.n_nodes) in table.curves

    def candidates(self, coll: Collective, group: Group, topo: Fabric, gpu: GpuSpec,
                   others: tuple[Candidate, ...]) -> tuple[Candidate, ...]:
        table = self._table(gpu)
        assert table is not None
        key = (coll.kind, group.p, group.n_nodes)
        base = next((c for c in others if c.protocol == "Simple" and c.algorithm in self._BASES), None)
        timing = table.timing(*key, 1.0)
        if base is None or timing is None:
            return ()
        return (MeasuredCandidate(self.name, "measured", timing[0], base.base_phases, base.wire_factor, table, key),)


class AlgorithmRegistry:
    """Collective algorithms in the order their candidates are listed (ties go to the earlier one)."""

    def __init__(self, algorithms: Iterable[CollectiveAlgorithm] = ()):
        self._algorithms: list[CollectiveAlgorithm] = []
        for a in algorithms:
            self.register(a)

    def register(self, algorithm: CollectiveAlgorithm) -> CollectiveAlgorithm:
        """Add an algorithm after the others (its name must be new); returns it."""
        if algorithm.name in self.names():
            raise ValueError(f"a collective algorithm named {algorithm.name!r} is already registered")
        self._algorithms.append(algorithm)
        return algorithm

    def names(self) -> tuple[str, ...]:
        """Registered algorithm names, in order."""
        return tuple(a.name for a in self._algorithms)

    def __iter__(self) -> Iterator[CollectiveAlgorithm]:
        return iter(self._algorithms)

    def candidates(self, coll: Collective, gpus: tuple[int, ...], topo: Fabric,
                   gpu: GpuSpec) -> tuple[Candidate, ...]:
        """Every applicable (algorithm, protocol) for ``coll`` on ``gpus`` (at least 2), planned for a
        1-byte collective; only a replacing algorithm's (a measured curve) when it has some."""
        group = Group.of(topo, gpus)
        applicable = [a for a in self._algorithms if a.applies(coll, group, topo, gpu)]
        if not applicable:
            raise ValueError(f"no registered collective algorithm runs a {coll} (registered: "
                             f"{', '.join(self.names())})")
        out = tuple(c for a in applicable if not a.replaces_others for c in a.candidates(coll, group, topo, gpu, ()))
        for a in applicable:
            if a.replaces_others and (own := a.candidates(coll, group, topo, gpu, out)):
                return own
        return out


#: The algorithms simtrain plans with, in NCCL's listing order.
ALGORITHMS = AlgorithmRegistry([RingShift(), Pairwise(), NodeLimitedA2A(), Ring(), Tree(), Hierarchical2D(), Nvls(),
                                MeasuredTable()])
