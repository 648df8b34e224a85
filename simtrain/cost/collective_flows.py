"""The building blocks of collective algorithms: flows, plans, candidates, NCCL's latency constants.

A plan is a latency plus phases of flows (src GPU, path of directed edges, bytes on the wire). The
algorithms that produce them are in ``simtrain.cost.collective_algorithms``; choosing among them is
``simtrain.cost.collectives``.

Protocol (LL, LL128, Simple) multiplies the wire bytes (LL carries 4 data bytes per 8; LL128 120 per
128) and sets the latency constants of NCCL's tuning model (``src/graph/tuning.cc``, Table B2).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from simtrain.cost.calibrated import CollectiveTable
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.collective_kinds import CollectiveKind

US = 1e-6
# NCCL tuning.cc (Hopper), microseconds: base latency and per-hop latency by (algo, proto).
BASE_LAT_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
               "nvls": {"Simple": 0.0}}
INTRA_LAT_US = {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}, "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                "nvls": {"Simple": 25.0}}
INTER_LAT_US = {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}, "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}}
WIRE_FACTOR = {"LL": 2.0, "LL128": 128.0 / 120.0, "Simple": 1.0}
PROTOCOLS = ("LL", "LL128", "Simple")
TREE_DERATE = 0.92 * 0.85

Edge = tuple[str, str]
Phases = tuple[tuple["Flow", ...], ...]


@dataclass(frozen=True, slots=True)
class Flow:
    """Bytes a GPU puts on a path; ``cap_Bps`` bounds its rate (NVLS), else the links do."""

    src: int
    path: tuple[Edge, ...]
    nbytes: float
    cap_Bps: float = math.inf


@dataclass(frozen=True, slots=True)
class Plan:
    """An algorithm's flows for the whole group: latency, then phases run one after another."""

    algorithm: str
    protocol: str
    latency_s: float
    phases: Phases
    estimate_s: float = 0.0

    def for_source(self, gpu: int) -> Phases:
        """The phases restricted to the flows one GPU sends."""
        return tuple(tuple(f for f in ph if f.src == gpu) for ph in self.phases)


def nodes_of(topo: Fabric, gpus: tuple[int, ...]) -> dict[int, list[int]]:
    """The group's GPUs by node, nodes and GPUs in first-seen (rank) order."""
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        by_node.setdefault(topo.node_of(g), []).append(g)
    return by_node


def route_flow(topo: Fabric, src: int, dst: int, nbytes: float, cap: float = math.inf) -> Flow:
    """A flow of ``nbytes`` from ``src`` to ``dst`` over the topology's route."""
    return Flow(src, topo.route(src, dst), nbytes, cap)


def ring_flows(topo: Fabric, gpus: tuple[int, ...], per_gpu: float) -> tuple[Flow, ...]:
    """Ring traffic of ``per_gpu`` bytes per GPU, with NCCL's rotated multi-channel rings across nodes:
    each GPU sends (k-1)/k of its traffic over NVLink and 1/k through its own NIC to its rail peer in the
    next node (busbw = min(k/(k-1)*NVLink, k*NIC), the k*NIC bound of the reference, note 4)."""
    p = len(gpus)
    if p < 2 or per_gpu <= 0:
        return ()
    by_node = nodes_of(topo, gpus)
    nodes = list(by_node)
    k = len(by_node[nodes[0]])
    regular = all(len(v) == k for v in by_node.values())
    if len(nodes) == 1 or not regular:
        return tuple(route_flow(topo, g, gpus[(i + 1) % p], per_gpu) for i, g in enumerate(gpus))
    flows = []
    for ni, n in enumerate(nodes):
        local = by_node[n]
        nxt = by_node[nodes[(ni + 1) % len(nodes)]]
        for j, g in enumerate(local):
            if k > 1:
                flows.append(route_flow(topo, g, local[(j + 1) % k], per_gpu * (k - 1) / k))
            flows.append(route_flow(topo, g, nxt[j], per_gpu / k))
    return tuple(flows)


def ring_latency(kind: CollectiveKind, p: int, n_nodes: int, proto: str, algo: str, net_lat: float) -> float:
    """NCCL's ring latency, seconds: base + intra hops + inter-node hops (tuning.cc, Table B2)."""
    if kind is CollectiveKind.ALL_REDUCE:  # NCCL's nsteps: 2(p-1) for all-reduce, p-1 for a gather or scatter
        steps, inter = 2 * (p - 1), 2 * (n_nodes - 1)
    else:
        steps = p - 1 if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER) else p
        inter = n_nodes - 1
    inter_lat = INTER_LAT_US[algo][proto] * US + net_lat * (2 if proto == "Simple" else 1)
    return BASE_LAT_US[algo][proto] * US + (steps - inter) * INTRA_LAT_US[algo][proto] * US + inter * inter_lat


def tree_latency(p: int, n_nodes: int, proto: str, net_lat: float) -> float:
    """NCCL's tree all-reduce latency, seconds: intra-node chain plus log-depth across nodes, up and down."""
    ppn = max(p // max(n_nodes, 1), 1)
    inter_lat = INTER_LAT_US["tree"][proto] * US + net_lat
    return BASE_LAT_US["tree"][proto] * US + 2 * ((ppn - 1) * INTRA_LAT_US["tree"][proto] * US
                                                  + math.log2(max(n_nodes, 1)) * inter_lat)


def idle_time(capacity: Callable[[Edge], float], phases: Phases) -> float:
    """Time of the phases on an otherwise idle network: per phase, the slowest flow at its fair share."""
    total = 0.0
    for ph in phases:
        load: Counter[Edge] = Counter(e for f in ph for e in f.path)
        worst = 0.0
        for f in ph:
            rate = f.cap_Bps
            for e in f.path:
                rate = min(rate, capacity(e) / load[e])
            worst = max(worst, f.nbytes / rate if f.nbytes else 0.0)
        total += worst
    return total


def effective_bandwidth(topo: Fabric, gpu: GpuSpec, e: Edge) -> float:
    """Achievable bandwidth of an edge: link rate x the protocol efficiency of its class (Table D)."""
    attrs = topo.edge(*e)
    eff = {"nvlink": gpu.nvlink_efficiency, "net": gpu.nic_efficiency}.get(attrs.link_class, 0.8)
    return attrs.bandwidth_Bps * eff


def scaled(phases: Phases, factor: float) -> Phases:
    """The phases with every flow's bytes multiplied by ``factor``."""
    return tuple(tuple(Flow(f.src, f.path, f.nbytes * factor, f.cap_Bps) for f in ph) for ph in phases)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (algorithm, protocol) for a group. Every flow scales linearly with the collective's size
    (and with the protocol's wire factor), so a group's flows are planned once, for 1 byte, and the
    protocols of one algorithm share them: flows of ``size`` bytes are ``base_phases`` x
    ``wire_factor`` x ``size``.

    Attributes:
        algorithm: the registered algorithm's name ("ring", "tree", ...).
        protocol: NCCL protocol ("LL", "LL128", "Simple"), or "measured".
        latency_s: fixed time before the flows, seconds.
        base_phases: the flows of a 1-byte collective.
        wire_factor: bytes on the wire per byte of flow (protocol overhead, tree derate).
    """

    algorithm: str
    protocol: str
    latency_s: float
    base_phases: Phases
    wire_factor: float

    def phases(self, size_bytes: float) -> Phases:
        """The flows of a ``size_bytes`` collective."""
        return scaled(self.base_phases, self.wire_factor * size_bytes)


@dataclass(frozen=True, slots=True)
class MeasuredCandidate(Candidate):
    """A calibrated profile's measured curve for this group (``simtrain/hardware/profile.py``): the default
    Simple-protocol flows, each rate-capped so that on an idle network ``latency_s`` plus the flows
    take the measured time t(S) at every size (links still bound them, and contention still applies)."""

    table: CollectiveTable | None = None
    key: tuple[CollectiveKind, int, int] = (CollectiveKind.ALL_REDUCE, 0, 0)

    def phases(self, size_bytes: float) -> Phases:
        assert self.table is not None
        timing = self.table.timing(*self.key, size_bytes)
        wire_s = timing[1] - self.latency_s if timing else 0.0
        scale = self.wire_factor * size_bytes
        return tuple(tuple(Flow(f.src, f.path, f.nbytes * scale, f.nbytes * scale / wire_s if wire_s > 0 else math.inf)
                           for f in ph) for ph in self.base_phases)
