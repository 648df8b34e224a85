"""Collective algorithms lowered to flows over the cluster graph, chosen as NCCL would.

A plan is a latency plus phases of flows (src GPU, path of directed edges, bytes on the wire).
Algorithms (reference Table B, B2):

- ring: each GPU sends 2(p-1)/p*S (all-reduce) or (p-1)/p*S (all-gather/reduce-scatter) to its ring
  successor. Across nodes NCCL runs one ring per channel, rotated so each node boundary is crossed on
  every NIC: a GPU sends (k-1)/k of its traffic over NVLink and 1/k through its own NIC to its rail
  peer in the next node: busbw = min(k/(k-1)*NVLink, k*NIC), the k*NIC bound of the reference (note 4).
- tree (all-reduce, several nodes): the ring's traffic at NCCL's tree derate (x0.92, x0.85 for the
  TREE pattern) with log-depth latency.
- nvls (all-reduce in one NVSwitch node, p >= nvls_min_gpus): each GPU sends S to the switch and
  receives S back at the calibrated NVLS algbw (note 1: t = a + S/B_nvls_alg).
- hier2d (all-reduce over m nodes x k GPUs): reduce-scatter in the node, all-reduce S/k across nodes
  on each rail, all-gather in the node (Table B "Hierarchical (2D)").
- pairwise all-to-all: S/p to every peer. send: one flow.

Protocol (LL, LL128, Simple) multiplies the wire bytes (LL carries 4 data bytes per 8; LL128 120 per
128) and sets the latency constants of NCCL's tuning model (``src/graph/tuning.cc``, Table B2).
NCCL picks the (algorithm, protocol) with the lowest predicted time; so do we, with the prediction
computed from our own flows on an idle network.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from simtrain.calibrated import CollectiveTable
from simtrain.hardware import GpuSpec
from simtrain.topology import Topology

US = 1e-6
# NCCL tuning.cc (Hopper), microseconds: base latency and per-hop latency by (algo, proto).
BASE_LAT_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
               "nvls": {"Simple": 0.0}}
INTRA_LAT_US = {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}, "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                "nvls": {"Simple": 25.0}}
INTER_LAT_US = {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}, "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}}
WIRE_FACTOR = {"LL": 2.0, "LL128": 128.0 / 120.0, "Simple": 1.0}
TREE_DERATE = 0.92 * 0.85

Edge = tuple[str, str]


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
    phases: tuple[tuple[Flow, ...], ...]
    estimate_s: float = 0.0

    def for_source(self, gpu: int) -> tuple[tuple[Flow, ...], ...]:
        """The phases restricted to the flows one GPU sends."""
        return tuple(tuple(f for f in ph if f.src == gpu) for ph in self.phases)


def _nodes(topo: Topology, gpus: tuple[int, ...]) -> dict[int, list[int]]:
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        by_node.setdefault(topo.node_of(g), []).append(g)
    return by_node


def _flow(topo: Topology, src: int, dst: int, nbytes: float, cap: float = math.inf) -> Flow:
    return Flow(src, topo.route(src, dst), nbytes, cap)


def ring_flows(topo: Topology, gpus: tuple[int, ...], per_gpu: float) -> tuple[Flow, ...]:
    """Ring traffic of ``per_gpu`` bytes per GPU, with NCCL's rotated multi-channel rings across nodes."""
    p = len(gpus)
    if p < 2 or per_gpu <= 0:
        return ()
    by_node = _nodes(topo, gpus)
    nodes = list(by_node)
    k = len(by_node[nodes[0]])
    regular = all(len(v) == k for v in by_node.values())
    if len(nodes) == 1 or not regular:
        return tuple(_flow(topo, g, gpus[(i + 1) % p], per_gpu) for i, g in enumerate(gpus))
    flows = []
    for ni, n in enumerate(nodes):
        local = by_node[n]
        nxt = by_node[nodes[(ni + 1) % len(nodes)]]
        for j, g in enumerate(local):
            if k > 1:
                flows.append(_flow(topo, g, local[(j + 1) % k], per_gpu * (k - 1) / k))
            flows.append(_flow(topo, g, nxt[j], per_gpu / k))
    return tuple(flows)


def _ring_latency(kind: str, p: int, n_nodes: int, proto: str, algo: str, net_lat: float) -> float:
    """NCCL's ring latency: base + intra hops + inter-node hops (tuning.cc, Table B2)."""
    steps = {"all_reduce": 2 * (p - 1), "all_gather": p - 1, "reduce_scatter": p - 1}.get(kind, p)
    inter = {"all_reduce": 2 * (n_nodes - 1)}.get(kind, n_nodes - 1)
    inter_lat = INTER_LAT_US[algo][proto] * US + net_lat * (2 if proto == "Simple" else 1)
    return BASE_LAT_US[algo][proto] * US + (steps - inter) * INTRA_LAT_US[algo][proto] * US + inter * inter_lat


def _tree_latency(p: int, n_nodes: int, proto: str, net_lat: float) -> float:
    ppn = max(p // max(n_nodes, 1), 1)
    inter_lat = INTER_LAT_US["tree"][proto] * US + net_lat
    return BASE_LAT_US["tree"][proto] * US + 2 * ((ppn - 1) * INTRA_LAT_US["tree"][proto] * US
                                                  + math.log2(max(n_nodes, 1)) * inter_lat)


def idle_time(capacity: Callable[[Edge], float], phases: tuple[tuple[Flow, ...], ...]) -> float:
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


def effective_bandwidth(topo: Topology, gpu: GpuSpec, e: Edge) -> float:
    """Achievable bandwidth of an edge: link rate x the protocol efficiency of its class (Table D)."""
    attrs = topo.edge(*e)
    eff = {"nvlink": gpu.nvlink_efficiency, "net": gpu.nic_efficiency}.get(attrs.link_class, 0.8)
    return attrs.bandwidth_Bps * eff


def _scaled(phases: tuple[tuple[Flow, ...], ...], factor: float) -> tuple[tuple[Flow, ...], ...]:
    return tuple(tuple(Flow(f.src, f.path, f.nbytes * factor, f.cap_Bps) for f in ph) for ph in phases)


def _candidates(kind: str, topo: Topology, gpu: GpuSpec, gpus: tuple[int, ...], size: float):  # type: ignore[no-untyped-def]
    p = len(gpus)
    by_node = _nodes(topo, gpus)
    n_nodes = len(by_node)
    net_lat = topo.cluster.net_hop_latency_s * 2 if n_nodes > 1 else 0.0
    if kind == "ring_shift":
        # Ring attention's KV exchange: every GPU sends its block to the next rank (P2P send/recv pairs,
        # Megatron-core p2p context parallelism), at a point-to-point latency (plan_send).
        flows = tuple(_flow(topo, g, gpus[(i + 1) % p], size) for i, g in enumerate(gpus))
        hop = INTER_LAT_US["ring"]["Simple"] * US + net_lat if n_nodes > 1 else INTRA_LAT_US["ring"]["Simple"] * US
        yield "p2p", "Simple", BASE_LAT_US["ring"]["Simple"] * US + hop, (flows,), 1.0
        return
    if kind.startswith("all_to_all_nodes_"):
        yield from _node_limited_a2a(kind, topo, gpus, size, by_node, net_lat)
        return
    if kind == "all_to_all":
        flows = tuple(_flow(topo, g, h, size / p) for g in gpus for h in gpus if g != h)
        yield "pairwise", "Simple", _ring_latency(kind, p, n_nodes, "Simple", "ring", net_lat), (flows,), 1.0
        return
    per_gpu = (2.0 if kind == "all_reduce" else 1.0) * (p - 1) / p * size
    ring = (ring_flows(topo, gpus, per_gpu),)
    for proto in ("LL", "LL128", "Simple"):
        yield "ring", proto, _ring_latency(kind, p, n_nodes, proto, "ring", net_lat), ring, WIRE_FACTOR[proto]
    if kind != "all_reduce":
        return
    if n_nodes > 1:
        for proto in ("LL", "LL128", "Simple"):
            yield ("tree", proto, _tree_latency(p, n_nodes, proto, net_lat), ring,
                   WIRE_FACTOR[proto] / TREE_DERATE)
        k = len(next(iter(by_node.values())))
        if k > 1 and all(len(v) == k for v in by_node.values()):
            yield "hier2d", "Simple", _hier_latency(p, k, n_nodes, net_lat), _hier_phases(topo, by_node, size), 1.0
    elif topo.cluster.node.scaleup == "nvswitch" and gpu.has_nvls and p >= gpu.nvls_min_gpus:
        sw = f"nvsw{topo.node_of(gpus[0])}"
        up = tuple(Flow(g, ((f"gpu{g}", sw),), size, gpu.nvls_algbw_Bps) for g in gpus)
        down = tuple(Flow(g, ((sw, f"gpu{g}"),), size, gpu.nvls_algbw_Bps) for g in gpus)
        yield "nvls", "Simple", (BASE_LAT_US["nvls"]["Simple"] + INTRA_LAT_US["nvls"]["Simple"]) * US, (up + down,), 1.0


def node_hit_probability(n_nodes: int, k: int, n_experts: int, m_nodes: int = 0) -> float:
    """Probability that a token's top-``k`` experts include one on a given node, with ``n_experts`` spread
    evenly over ``n_nodes`` and routing balanced: ``m_nodes/n_nodes`` when routing is limited to
    ``m_nodes`` nodes (DeepSeek-V3 sec. 3.2.2), else 1 - C(E - E/N, k) / C(E, k) (none of the k experts,
    drawn without replacement, is among that node's E/N)."""
    if m_nodes:
        return min(m_nodes, n_nodes, k) / n_nodes
    others = n_experts - n_experts // n_nodes
    return 1.0 - math.comb(others, k) / math.comb(n_experts, k) if k <= n_experts else 1.0


def _node_limited_a2a(kind: str, topo: Topology, gpus: tuple[int, ...], size: float,
                      by_node: dict[int, list[int]], net_lat: float):  # type: ignore[no-untyped-def]
    """All-to-all of ``size`` bytes per GPU (k copies of each token) that crosses the network once per
    remote node a token is routed to, to the rail peer, which forwards its copies over NVLink (DeepEP's
    internode kernels; HybridEP likewise). ``all_to_all_nodes_{M}_{k}``: node-limited routing, at most M
    of the N nodes per token (DeepSeek-V3 sec. 3.2.2, expert groups = nodes); ``all_to_all_nodes_0_{k}_{E}``:
    unrestricted top-k over E experts (``node_hit_probability``). Per GPU: size/k x P(node hit) to each
    remote rail peer, and size/L to each of the other L-1 GPUs of its node, concurrently (IB and NVLink
    are disjoint links)."""
    fields = [int(x) for x in kind.removeprefix("all_to_all_nodes_").split("_")]
    m_nodes, k = fields[0], fields[1]
    n_experts = fields[2] if len(fields) > 2 else 0
    nodes = list(by_node.values())
    n, local = len(nodes), len(nodes[0])
    p = len(gpus)
    lat = _ring_latency("all_to_all", p, n, "Simple", "ring", net_lat)
    if n == 1 or any(len(v) != local for v in nodes):  # one node or irregular: plain pairwise
        yield "pairwise", "Simple", lat, (tuple(_flow(topo, g, h, size / p) for g in gpus for h in gpus if g != h),), 1.0
        return
    ib = size / k * node_hit_probability(n, k, n_experts, m_nodes)
    flows = []
    for ni, node in enumerate(nodes):
        for j, g in enumerate(node):
            flows += [_flow(topo, g, other[j], ib) for nj, other in enumerate(nodes) if nj != ni]
            flows += [_flow(topo, g, h, size / local) for h in node if h != g]
    yield "node_limited", "Simple", lat, (tuple(flows),), 1.0


def _hier_latency(p: int, k: int, m: int, net_lat: float) -> float:
    return (_ring_latency("reduce_scatter", k, 1, "Simple", "ring", 0.0) * 2
            + _ring_latency("all_reduce", m, m, "Simple", "ring", net_lat))


def _hier_phases(topo: Topology, by_node: dict[int, list[int]], size: float) -> tuple[tuple[Flow, ...], ...]:
    nodes = list(by_node.values())
    k, m = len(nodes[0]), len(nodes)
    intra = tuple(f for local in nodes for f in ring_flows(topo, tuple(local), (k - 1) / k * size))
    inter = tuple(f for j in range(k) for f in ring_flows(topo, tuple(n[j] for n in nodes),
                                                          2.0 * (m - 1) / m * size / k))
    return (intra, inter, intra)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (algorithm, protocol) for a group. Every flow scales linearly with the collective's size
    (and with the protocol's wire factor), so a group's flows are planned once, for 1 byte, and the
    protocols of one algorithm share them: flows of ``size`` bytes are ``base_phases`` x
    ``wire_factor`` x ``size``."""

    algorithm: str
    protocol: str
    latency_s: float
    base_phases: tuple[tuple[Flow, ...], ...]
    wire_factor: float

    def phases(self, size_bytes: float) -> tuple[tuple[Flow, ...], ...]:
        """The flows of a ``size_bytes`` collective."""
        return _scaled(self.base_phases, self.wire_factor * size_bytes)


@dataclass(frozen=True, slots=True)
class MeasuredCandidate(Candidate):
    """A calibrated profile's measured curve for this group (``simtrain/profile.py``): the default
    Simple-protocol flows, each rate-capped so that on an idle network ``latency_s`` plus the flows
    take the measured time t(S) at every size (links still bound them, and contention still applies)."""

    table: CollectiveTable | None = None
    key: tuple[str, int, int] = ("", 0, 0)

    def phases(self, size_bytes: float) -> tuple[tuple[Flow, ...], ...]:
        assert self.table is not None
        timing = self.table.timing(*self.key, size_bytes)
        wire_s = timing[1] - self.latency_s if timing else 0.0
        scale = self.wire_factor * size_bytes
        return tuple(tuple(Flow(f.src, f.path, f.nbytes * scale, f.nbytes * scale / wire_s if wire_s > 0 else math.inf)
                           for f in ph) for ph in self.base_phases)


def _measured(kind: str, gpus: tuple[int, ...], topo: Topology, gpu: GpuSpec,
              defaults: tuple[Candidate, ...]) -> MeasuredCandidate | None:
    """The measured candidate when ``gpu`` carries calibrated curves for (kind, ranks, nodes), else None."""
    table = getattr(gpu, "collectives", None)
    key = (kind, len(gpus), len(_nodes(topo, gpus)))
    if not isinstance(table, CollectiveTable) or key not in table.curves:
        return None
    base = next((c for c in defaults if c.protocol == "Simple" and c.algorithm in ("ring", "pairwise", "p2p")), None)
    timing = table.timing(*key, 1.0)
    if base is None or timing is None:
        return None
    return MeasuredCandidate("measured", "measured", timing[0], base.base_phases, base.wire_factor, table, key)


def collective_candidates(kind: str, gpus: tuple[int, ...], topo: Topology, gpu: GpuSpec) -> tuple[Candidate, ...]:
    """Every (algorithm, protocol) NCCL could run for this group, planned for a 1-byte collective
    (only the measured one when a calibrated profile has a curve for this group)."""
    if len(gpus) < 2:
        return ()
    defaults = tuple(Candidate(*c) for c in _candidates(kind, topo, gpu, gpus, 1.0))
    measured = _measured(kind, gpus, topo, gpu, defaults)
    return (measured,) if measured is not None else defaults


def unit_idle_times(candidates: tuple[Candidate, ...], capacity: Callable[[Edge], float]) -> tuple[float, ...]:
    """Idle-network time per byte of size of each candidate (base phases evaluated once each)."""
    base: dict[int, float] = {}
    out = []
    for c in candidates:
        t = base.get(id(c.base_phases))
        if t is None:
            t = base[id(c.base_phases)] = idle_time(capacity, c.base_phases)
        out.append(t * c.wire_factor)
    return tuple(out)


def choose_plan(candidates: tuple[Candidate, ...], idle_s_per_byte: tuple[float, ...] | None, size_bytes: float,
                choice: tuple[str, str] | None = None) -> Plan:
    """The candidate with the lowest predicted time (latency + idle-network flow time) at this size,
    as NCCL's tuner picks the lowest predicted time (tuning.cc); ``choice`` forces one instead (then
    ``idle_s_per_byte`` may be None)."""
    if not candidates or size_bytes <= 0:
        return Plan("none", "none", 0.0, ())
    if choice is not None:
        best = next(c for c in candidates if (c.algorithm, c.protocol) == choice)
        return Plan(best.algorithm, best.protocol, best.latency_s, best.phases(size_bytes))
    assert idle_s_per_byte is not None
    est, i = min((c.latency_s + t * size_bytes, i) for i, (c, t) in enumerate(zip(candidates, idle_s_per_byte,
                                                                                   strict=True)))
    best = candidates[i]
    return Plan(best.algorithm, best.protocol, best.latency_s, best.phases(size_bytes), est)


def plan_collective(kind: str, gpus: tuple[int, ...], size_bytes: float, topo: Topology, gpu: GpuSpec,
                    capacity: Callable[[Edge], float] | None = None, choice: tuple[str, str] | None = None) -> Plan:
    """The (algorithm, protocol) NCCL would pick for this group and size, with its flows.

    Args:
        kind: "all_reduce", "all_gather", "reduce_scatter", "all_to_all", or "ring_shift" (every GPU
            sends ``size_bytes`` to the next GPU of the group).
        gpus: the group's GPUs in rank order.
        size_bytes: nccl-tests size S (all-gather/reduce-scatter: the whole gathered array).
        capacity: achievable bandwidth per edge (default: ``effective_bandwidth``).
        choice: (algorithm, protocol) to use instead of choosing (symmetric peers of a planned group).
    """
    if len(gpus) < 2 or size_bytes <= 0:
        return Plan("none", "none", 0.0, ())
    cap = capacity or (lambda e: effective_bandwidth(topo, gpu, e))
    cands = collective_candidates(kind, gpus, topo, gpu)
    return choose_plan(cands, None if choice else unit_idle_times(cands, cap), size_bytes, choice)


def plan_send(src: int, dst: int, size_bytes: float, topo: Topology) -> Plan:
    """Point-to-point send (PP activations/gradients): alpha + S/B over the route (Table B)."""
    path = topo.route(src, dst)
    n_net = sum(1 for e in path if topo.edge(*e).link_class == "net")
    lat = (BASE_LAT_US["ring"]["Simple"] + (INTER_LAT_US["ring"]["Simple"] if n_net else
                                             INTRA_LAT_US["ring"]["Simple"])) * US + topo.path_latency_s(path)
    table = getattr(topo.cluster.gpu, "collectives", None)  # a calibrated profile's send/recv curve
    timing = table.timing("send", 2, 2 if n_net else 1, size_bytes) if isinstance(table, CollectiveTable) else None
    if timing is not None:
        wire_s = timing[1] - timing[0]
        cap = size_bytes / wire_s if wire_s > 0 else math.inf
        return Plan("measured", "measured", timing[0], ((Flow(src, path, size_bytes, cap),),))
    return Plan("p2p", "Simple", lat, ((Flow(src, path, size_bytes),),))
