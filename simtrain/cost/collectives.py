"""Planning a collective as NCCL would: ask the algorithm registry for candidates, pick the fastest.

A plan is a latency plus phases of flows (src GPU, path of directed edges, bytes on the wire); the
flows, plans and NCCL's latency constants are in ``simtrain.cost.collective_flows``, the algorithms (ring,
tree, hier2d, nvls, pairwise and node-limited all-to-all, p2p ring shift, measured curve) in
``simtrain.cost.collective_algorithms``, and what a collective is (kind + typed options) in
``simtrain.lower.collective_kinds``. NCCL picks the (algorithm, protocol) with the lowest predicted time;
so do we, with the prediction computed from our own flows on an idle network.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from simtrain.cost.calibrated import CollectiveTable
from simtrain.cost.collective_algorithms import ALGORITHMS, AlgorithmRegistry, node_hit_probability
from simtrain.cost.collective_flows import (
    BASE_LAT_US,
    INTER_LAT_US,
    INTRA_LAT_US,
    US,
    Candidate,
    Edge,
    Flow,
    MeasuredCandidate,
    Plan,
    effective_bandwidth,
    idle_time,
    ring_flows,
)
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.collective_kinds import Collective, CollectiveKind

__all__ = ["Candidate", "Edge", "Flow", "MeasuredCandidate", "Plan", "choose_plan", "collective_candidates",
           "effective_bandwidth", "idle_time", "node_hit_probability", "plan_collective", "plan_send", "ring_flows",
           "unit_idle_times"]


def collective_candidates(coll: Collective | CollectiveKind, gpus: tuple[int, ...], topo: Fabric, gpu: GpuSpec,
                          registry: AlgorithmRegistry = ALGORITHMS) -> tuple[Candidate, ...]:
    """Every (algorithm, protocol) of ``registry`` that can run ``coll`` on this group, planned for a
    1-byte collective (only the measured one when a calibrated profile has a curve for this group)."""
    if len(gpus) < 2:
        return ()
    return registry.candidates(Collective.of(coll), gpus, topo, gpu)


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


def plan_collective(coll: Collective | CollectiveKind, gpus: tuple[int, ...], size_bytes: float, topo: Fabric,
                    gpu: GpuSpec, capacity: Callable[[Edge], float] | None = None,
                    choice: tuple[str, str] | None = None) -> Plan:
    """The (algorithm, protocol) NCCL would pick for this group and size, with its flows.

    Args:
        coll: the collective (a bare kind has no options): all-reduce, all-gather, reduce-scatter,
            all-to-all (``NodeLimited`` options: deduplicated), or ring shift (every GPU sends
            ``size_bytes`` to the next GPU of the group).
        gpus: the group's GPUs in rank order.
        size_bytes: nccl-tests size S (all-gather/reduce-scatter: the whole gathered array).
        capacity: achievable bandwidth per edge (default: ``effective_bandwidth``).
        choice: (algorithm, protocol) to use instead of choosing (symmetric peers of a planned group).
    """
    if len(gpus) < 2 or size_bytes <= 0:
        return Plan("none", "none", 0.0, ())
    cap = capacity or (lambda e: effective_bandwidth(topo, gpu, e))
    cands = collective_candidates(coll, gpus, topo, gpu)
    return choose_plan(cands, None if choice else unit_idle_times(cands, cap), size_bytes, choice)


def plan_send(src: int, dst: int, size_bytes: float, topo: Fabric) -> Plan:
    """Point-to-point send (PP activations/gradients): alpha + S/B over the route (Table B)."""
    path = topo.route(src, dst)
    n_net = sum(1 for e in path if topo.edge(*e).link_class == "net")
    lat = (BASE_LAT_US["ring"]["Simple"] + (INTER_LAT_US["ring"]["Simple"] if n_net else
                                             INTRA_LAT_US["ring"]["Simple"])) * US + topo.path_latency_s(path)
    table = getattr(topo.cluster.gpu, "collectives", None)  # a calibrated profile's send/recv curve
    timing = (table.timing(CollectiveKind.SEND, 2, 2 if n_net else 1, size_bytes) if isinstance(table, CollectiveTable)
              else None)
    if timing is not None:
        wire_s = timing[1] - timing[0]
        cap = size_bytes / wire_s if wire_s > 0 else math.inf
        return Plan("measured", "measured", timing[0], ((Flow(src, path, size_bytes, cap),),))
    return Plan("p2p", "Simple", lat, ((Flow(src, path, size_bytes),),))
