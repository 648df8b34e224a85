"""The critical-path evaluator: a lowered, costed program timed without flow contention.

The second evaluator of the same program the engine runs (``simtrain.engine.engine``). Each op starts when
its stream is free (ops of one stream run in list order), its ``deps`` (other streams, same program)
and its ``remote`` op (another stage's program: a pipeline send) have finished, and takes

- a compute op: its modelled time (``op_duration``), the routed-expert part scaled by the rank's
  routed load (``simtrain.plan.routing``), as the engine does; no slow-down from collectives in flight
  (the engine's ``GpuSpec.comm_interference_*``: a contention effect this evaluator leaves out);
- a host copy: its modelled time;
- a collective or a send: the time of the same plan the engine uses (``CommPlanner``: algorithm,
  protocol, flows and the weights of the symmetric copies of the stage), on a network carrying
  nothing else (``network.fluid_duration``, the engine's own offline time of a private op). The engine
  stretches a comm-stream collective by ``GpuSpec.comm_in_situ_slowdown`` times the compute that ran
  beside it (a calibrated CPU profile's gloo beside busy cores); this evaluator, which places each
  stream's ops before it knows what runs beside them, leaves that out as it leaves out the compute's
  slowdown, so it stays a lower bound of the engine.

Pipeline ordering is the program's own (the lowered schedule's action order and its send/receive
pairs), so there is no separate schedule formula. Times are a longest path through the DAG, so the
order in which ops are resolved does not change them. What it returns (``CriticalPathResult``): the
step time, per stage busy time by category, exposed communication by axis and pipeline bubble of the
stage's representative rank (charged as the engine charges its compute stream's waits), and each
stage's memory peak from the ops' ledger deltas. Where no two flows of the program ever meet on a
link (e.g. tensor parallelism inside one node), the engine computes the same times, so the two agree
to rounding; elsewhere the engine is slower by the contention it models (``benchmarks/README.md``:
the spread over a few hundred layouts).

``evaluate_run`` goes from a config, with the engine's steady-state shortcut (``simtrain.engine.steady``):
three short runs a pipeline period apart, extended linearly to the full micro-batch count.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.cost.host import RunAhead
from simtrain.engine.axes import AXES, _axis
from simtrain.engine.comm_planner import CommPlanner, symmetry_violation
from simtrain.engine.engine import RECENT_OPS
from simtrain.engine.network import fluid_duration
from simtrain.engine.prepare import attach_static_memory, group_axes
from simtrain.engine.steady import ERR_TOL, plan
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.fabric.wiring import fabric_of
from simtrain.hardware.hardware import ClusterSpec, GpuSpec
from simtrain.hardware.profile import compute_calibration, run_cluster
from simtrain.lower.layer_plan import microbatches
from simtrain.lower.lowering import Lowered
from simtrain.lower.ops import (
    CommOp,
    ComputeOp,
    CostedComputeOp,
    CostedCopyOp,
    Op,
    OpKind,
    Program,
    SendOp,
    Stream,
)
from simtrain.plan.layout import RankGrid, place
from simtrain.plan.load import load_config
from simtrain.plan.roles import roles
from simtrain.plan.routing import symmetric_load_factors
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import InfeasibleLayout
from simtrain.spec.stacks import get_stack


def op_duration(op: Op) -> tuple[float, float]:
    """(modelled time, routed-expert part of it) of a compute op or host copy, seconds.

    The one place this module reads op times: those the cost pass (``simtrain.cost.cost_pass``) attached."""
    if isinstance(op, CostedComputeOp):
        return op.duration_s, op.expert_s
    if isinstance(op, CostedCopyOp):
        return op.duration_s, 0.0
    raise TypeError(f"op {op.name!r} has no time: evaluate a costed program (simtrain.cost.cost_pass.cost_program)")


@dataclass(slots=True)
class StageTimes:
    """What the representative rank of one pipeline stage did (seconds; bytes for memory).

    Attributes:
        end_s: when its last op ended.
        busy_s: compute-stream time by category ("fwd", "bwd", "recompute", "optimizer").
        exposed_s: compute-stream idle time by the axis it waited for (``AXES``, "offload", "other").
        bubble_s: idle time waiting for a pipeline input not yet sent (fill, drain, imbalance).
        last_compute_end_s: when its last compute op ended (the rest of its step is trailing comm).
        last_axis: axis of its last op to end.
        peak_bytes: its memory ledger's peak (static memory plus the ops' deltas), before fragmentation.
        at_peak: the ledger by tag at that peak.
        flops: hardware FLOPs of its compute ops.
    """

    end_s: float = 0.0
    busy_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    exposed_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    bubble_s: float = 0.0
    last_compute_end_s: float = 0.0
    last_axis: str = "other"
    peak_bytes: float = 0.0
    at_peak: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0

    @property
    def compute_s(self) -> float:
        """Forward, backward and recompute time, seconds."""
        return self.busy_s.get("fwd", 0.0) + self.busy_s.get("bwd", 0.0) + self.busy_s.get("recompute", 0.0)

    def idle_s(self, step_time_s: float) -> float:
        """Compute-stream idle time over a step of ``step_time_s`` seconds, seconds."""
        return max(step_time_s - sum(self.busy_s.values()), 0.0)


@dataclass(slots=True)
class CriticalPathResult:
    """The critical-path evaluation of one step (seconds; bytes).

    Attributes:
        step_time_s: when the last op of any stage ends.
        stages: per pipeline stage, its (slowest role's) representative rank's times and memory.
        ops_evaluated: ops timed (all short runs together under the steady-state shortcut).
        note: how the step was obtained (steady-state extension or every micro-batch).
        op_start_s, op_end_s: per stage, per op (program index), when it started and ended (empty
            after a steady-state extension).
    """

    step_time_s: float
    stages: list[StageTimes]
    ops_evaluated: int = 0
    note: str = ""
    op_start_s: list[list[float]] = field(default_factory=list, repr=False)
    op_end_s: list[list[float]] = field(default_factory=list, repr=False)

    @property
    def critical_stage(self) -> int:
        """The stage that ends last (the lowest one on a tie within 1e-9 of the step)."""
        last = self.step_time_s
        return min(s for s, st in enumerate(self.stages) if st.end_s >= last - 1e-9 * last)

    @property
    def peak_bytes(self) -> float:
        """Largest stage memory peak, bytes (before fragmentation)."""
        return max(st.peak_bytes for st in self.stages)

    def fits(self, capacity_bytes: float, fragmentation_ratio: float = 0.0) -> bool:
        """Whether every stage's peak, with fragmentation, fits ``capacity_bytes``."""
        return self.peak_bytes * (1 + fragmentation_ratio) <= capacity_bytes

    def breakdown_s(self) -> dict[str, Any]:
        """The critical stage's step by cause, as ``StepResult.breakdown_s`` splits the engine's:
        compute, exposed communication per axis (its trailing communication after the last compute
        op to the axis of its last op), bubble, optimizer, offload."""
        st = self.stages[self.critical_stage]
        exposed = {a: st.exposed_s.get(a, 0.0) for a in AXES}
        tail = max(self.step_time_s - st.last_compute_end_s, 0.0)
        if tail > 0:
            exposed[st.last_axis if st.last_axis in exposed else "dp"] += tail
        return {"compute": st.compute_s, "exposed_comm": exposed, "bubble": st.bubble_s,
                "offload": st.exposed_s.get("offload", 0.0), "optimizer": st.busy_s.get("optimizer", 0.0)}


class CommTimer(Protocol):
    """What times a program's communication ops for ``evaluate``: seconds of collective or send ``op``
    of ``stage``'s representative alone on the fabric."""

    def time(self, op: Op, stage: int) -> float: ...

    def on_network(self, op: Op, stage: int) -> bool:
        """Whether ``op``'s flows leave the node through ``stage``'s representative's NIC."""
        ...


class _Comm:
    """Uncontended times of one program's communication ops, from the engine's plans (memoised)."""

    def __init__(self, planner: CommPlanner, reps: Sequence[int]):
        self.planner, self.reps = planner, reps
        self._memo: dict[tuple[Any, ...], float] = {}

    def time(self, op: Op, stage: int) -> float:
        """Seconds of collective or send ``op`` of ``stage``'s representative, alone on the fabric."""
        assert isinstance(op, CommOp)
        peer = op.peer_stage if isinstance(op, SendOp) else -1
        key = (stage, op.kind, op.coll, op.axis, op.comm_bytes, peer)
        t = self._memo.get(key)
        if t is None:
            rank = self.reps[stage]
            if isinstance(op, SendOp):
                latency, phases, _ = self.planner.send(op, rank, stage, self.reps[peer])
            else:
                latency, phases, _ = self.planner.collective(op, rank, stage)
            t = latency + sum(fluid_duration(ph, self.planner.capacity) for ph in phases)
            self._memo[key] = t
        return t

    def on_network(self, op: Op, stage: int) -> bool:
        """Whether ``op``'s plan crosses the network (its link class), for ``share_nic``."""
        assert isinstance(op, CommOp)
        rank = self.reps[stage]
        if isinstance(op, SendOp):
            topo = self.planner.topo
            return topo.node_of(place(rank)) != topo.node_of(place(self.reps[op.peer_stage]))
        return self.planner.collective(op, rank, stage)[2] == "net"


def evaluate(programs: Sequence[Program], grid: RankGrid, topo: Fabric, gpu: GpuSpec,
             planner: CommPlanner | None = None, load_factor: dict[int, float] | None = None,
             representatives: Sequence[int] | None = None, comm: CommTimer | None = None,
             share_nic: bool = False) -> CriticalPathResult:
    """Time one step of ``programs`` (one per pipeline stage, costed) on their stages' representative
    ranks with no flow contention.

    Args:
        programs: the lowered programs, with ``static_mem`` attached (``simulate``'s static memory).
        grid, topo, gpu: the rank grid, the fabric and the GPU.
        planner: a symmetric-mode CommPlanner to reuse (its plans are memos); None: a new one.
        load_factor: routed-expert time factor per representative rank (missing: 1).
        representatives: one rank per stage (default: ``grid.representative``).
        comm: what times the communication ops (default: the planner's plans, as the engine's).
        share_nic: a rank's own communication ops on different streams share its NIC: an op that
            crosses the network is stretched by the time the ops already placed on the rank's other
            streams hold the network within its window (the bytes of both go over the one link; e.g.
            ZeRO-3's parameter gathers beside the previous layer's gradient reduce-scatters). Needs a
            ``comm`` with ``on_network``. Off: every op alone on the fabric.
    """
    reps = list(representatives or [grid.representative(s) for s in range(len(programs))])
    comm = comm or _Comm(planner or CommPlanner(topo, gpu, grid, True), reps)
    loads = load_factor or {}
    n = len(programs)
    ends: list[list[float | None]] = [[None] * len(p.ops) for p in programs]
    starts: list[list[float]] = [[0.0] * len(p.ops) for p in programs]
    queues: list[list[list[Op]]] = []
    for prog in programs:
        by_stream: dict[Stream, list[Op]] = {}
        for op in prog.ops:
            by_stream.setdefault(op.stream, []).append(op)
        queues.append(list(by_stream.values()))
    heads = [[0] * len(q) for q in queues]
    free = [[0.0] * len(q) for q in queues]
    stats = [StageTimes() for _ in range(n)]
    recent: list[dict[Stream, deque[tuple[float, float, str]]]] = [defaultdict(lambda: deque(maxlen=RECENT_OPS))
                                                                   for _ in range(n)]
    events: list[list[tuple[float, int, tuple[tuple[str, float], ...]]]] = [[] for _ in range(n)]
    last_op: list[Op | None] = [None] * n
    flops_of: dict[int, float] = {}  # id(kernels) -> FLOPs: ops of every micro-batch share a layer's kernels
    # per stage, per stream: starts and ends of its ops over the network (in order: a stream is sequential)
    on_net: list[dict[int, tuple[list[float], list[float]]]] = [{} for _ in range(n)]
    run_ahead = [RunAhead() for _ in range(n)]  # the engine's rule for the step's first host stall
    seq = 0
    left = sum(len(p.ops) for p in programs)
    while left:
        progress = False
        for s in range(n):
            end_s, start_s = ends[s], starts[s]
            extra = loads.get(reps[s], 1.0) - 1.0
            st = stats[s]
            for q, stream_ops in enumerate(queues[s]):
                i = heads[s][q]
                while i < len(stream_ops):
                    op = stream_ops[i]
                    ready_deps, blocked = 0.0, False
                    blocker: tuple[str, int] | None = None
                    for d in op.deps:
                        e = end_s[d]
                        if e is None:
                            blocked = True
                            break
                        if blocker is None or e >= ready_deps:
                            ready_deps, blocker = e, ("dep", d)
                    if blocked:
                        break
                    remote_end = None
                    if op.remote is not None:
                        remote_end = ends[op.remote[0]][op.remote[1]]
                        if remote_end is None:
                            break
                    ready = free[s][q]
                    start = max(ready, ready_deps)
                    if remote_end is not None and remote_end > start:
                        start, blocker = remote_end, ("remote", -1)
                    if op.kind in (OpKind.COMPUTE, OpKind.COPY):
                        work, expert = op_duration(op)
                        dur = work + extra * expert if op.kind == OpKind.COMPUTE else work
                        if type(op) is CostedComputeOp and op.stream == Stream.COMPUTE:
                            dur -= op.host_stall_s - run_ahead[s].stall(op, start - st.last_compute_end_s)
                    else:
                        dur = comm.time(op, s)
                        if share_nic and op.stream != Stream.COMPUTE and comm.on_network(op, s):
                            dur += _held(on_net[s], q, start, start + dur)
                            spans_q = on_net[s].setdefault(q, ([], []))
                            spans_q[0].append(start)
                            spans_q[1].append(start + dur)
                    end = start + dur
                    start_s[op.idx], end_s[op.idx] = start, end
                    free[s][q] = end
                    if op.stream == Stream.COMPUTE:
                        if start > ready and blocker is not None:
                            _attribute(st, programs, s, op, blocker, ready, start, starts, recent[s])
                        st.busy_s[op.category] += dur
                        if isinstance(op, ComputeOp):
                            f = flops_of.get(id(op.kernels))
                            if f is None:
                                f = flops_of[id(op.kernels)] = op.flops
                            st.flops += f
                        st.last_compute_end_s = end
                    else:
                        recent[s][op.stream].append((start, end, _axis(op)))
                    if end >= st.end_s:
                        st.end_s, last_op[s] = end, op
                    if op.mem_start:
                        events[s].append((start, seq, op.mem_start))
                    if op.mem_end:
                        events[s].append((end, seq + 1, op.mem_end))
                    seq += 2
                    i += 1
                    left -= 1
                    progress = True
                heads[s][q] = i
        if not progress:
            raise ValueError("the programs' dependencies form a cycle: no op can start")
    for s, prog in enumerate(programs):
        last = last_op[s]
        stats[s].last_axis = _axis(last) if last is not None else "other"
        _ledger_peak(stats[s], prog.static_mem, events[s])
    return CriticalPathResult(max(st.end_s for st in stats), stats, sum(len(p.ops) for p in programs),
                              op_start_s=starts, op_end_s=[[e or 0.0 for e in row] for row in ends])


def _held(by_stream: dict[int, tuple[list[float], list[float]]], mine: int, t0: float, t1: float) -> float:
    """Seconds within [t0, t1] the other streams' network ops hold the link (``share_nic``)."""
    held = 0.0
    for q, (starts, ends) in by_stream.items():
        if q == mine:
            continue
        i = bisect_right(ends, t0)  # the first op still running after t0
        while i < len(starts) and starts[i] < t1:
            held += max(0.0, min(ends[i], t1) - max(starts[i], t0))
            i += 1
    return held


def _attribute(st: StageTimes, programs: Sequence[Program], s: int, op: Op, blocker: tuple[str, int],
               ready: float, start: float, starts: list[list[float]],
               recent: dict[Stream, deque[tuple[float, float, str]]]) -> None:
    """Charge the compute stream's idle gap from ``ready`` to ``start`` to what it waited for, as the
    engine does (``Engine._attribute``): a pipeline input to bubble up to when it was sent and to pp
    after; a comm stream's op to the axes of what that stream ran meanwhile."""
    kind, d = blocker
    if kind == "remote":
        assert op.remote is not None
        send_start = starts[op.remote[0]][op.remote[1]]
        bubble = max(0.0, min(send_start, start) - ready)
        st.bubble_s += bubble
        st.exposed_s["pp"] += (start - ready) - bubble
        return
    dep = programs[s].ops[d]
    axis = _axis(dep)
    if dep.stream == Stream.COMPUTE:
        st.exposed_s[axis] += start - ready
        return
    window = []
    for entry in reversed(recent[dep.stream]):
        if entry[1] <= ready:
            break
        window.append(entry)
    at = ready
    for _, e, ax in reversed(window):
        end = min(e, start)
        if end > at:
            st.exposed_s[ax] += end - at
            at = end
    if start > at:
        st.exposed_s[axis] += start - at


def _ledger_peak(st: StageTimes, static: dict[str, float],
                 events: list[tuple[float, int, tuple[tuple[str, float], ...]]]) -> None:
    """Replay a stage's memory deltas in time order (an op's frees at its end before the allocations
    of an op it enables at the same instant) and record the peak."""
    current: dict[str, float] = defaultdict(float)
    total = 0.0
    for tag, nbytes in static.items():
        current[tag] += nbytes
        total += nbytes
    st.peak_bytes, st.at_peak = total, dict(current)
    events.sort(key=lambda e: (e[0], e[1]))
    for _, _, deltas in events:
        for tag, nbytes in deltas:
            current[tag] += nbytes
            total += nbytes
        if total > st.peak_bytes:
            st.peak_bytes, st.at_peak = total, dict(current)


@dataclass(frozen=True, slots=True)
class _Setup:
    """What every evaluation of one run shares: cost model, cluster, grid, topology, plans, roles."""

    run: RunConfig
    cost: ComputeCostModel
    cluster: ClusterSpec
    grid: RankGrid
    topo: Fabric
    planner: CommPlanner
    roles: list[list[int]]

    @classmethod
    def of(cls, run: RunConfig) -> _Setup:
        cluster = run_cluster(run.hardware, run.layout.world_size)
        gpu = cluster.gpu
        grid = RankGrid(run.layout)
        topo = fabric_of(run.hardware.fabric, cluster)
        cost = ComputeCostModel(gpu, run.train.precision, calibration=compute_calibration(gpu),
                                stack=get_stack(run.train.stack), fp8_recipe=run.train.fp8_recipe)
        reps = roles(grid, topo, group_axes(run)) if symmetry_violation(grid, topo) is not None else []
        return cls(run, cost, cluster, grid, topo, CommPlanner(topo, gpu, grid, True), reps)

    def lowered(self, run: RunConfig) -> Lowered:
        """``run`` lowered and its static memory attached (as ``simulate`` does)."""
        low = lower(run, self.cost, self.cluster.node.host_link_Bps)
        if low.microbatches < 1:
            raise InfeasibleLayout("fewer sequences than data-parallel ranks", microbatches=low.microbatches)
        gpu = self.cluster.gpu
        attach_static_memory(run, low, gpu.cuda_context_bytes + gpu.nccl_buffer_bytes)
        return low

    def evaluate(self, low: Lowered) -> CriticalPathResult:
        """The slowest role's evaluation (one role: the stages' representatives)."""
        out = None
        for reps in self.roles or [[self.grid.representative(s) for s in range(self.run.layout.pp)]]:
            res = evaluate(low.programs, self.grid, self.topo, self.cluster.gpu, self.planner,
                           symmetric_load_factors(self.run, reps), reps)
            if out is None or res.step_time_s > out.step_time_s:
                out = res
        assert out is not None
        return out


def evaluate_run(config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None,
                 steady_state: bool | None = None) -> CriticalPathResult:
    """Evaluate one step of a run from its config (lowering and costing included).

    ``steady_state``: evaluate three short runs a pipeline period apart and extend them linearly
    (``simtrain.engine.steady``), as the engine does; None: the config's ``sim.steady_state``. Falls back
    to every micro-batch when the short runs are not on one line.

    Always one representative rank per stage (``sim.mode`` is not read: without contention the ranks
    of a stage differ only by where their groups sit, so layouts whose groups do not tile the nodes
    get one evaluation per role, ``simtrain.plan.roles``, the slowest setting the step).

    Raises:
        ConfigError: invalid input. InfeasibleLayout: fewer sequences than data-parallel ranks.
    """
    run = load_config(config, overrides)
    setup = _Setup.of(run)
    m = microbatches(run)
    steady = plan(run.layout.resolved_schedule, run.layout.pp, m)
    use = run.sim.steady_state if steady_state is None else steady_state
    if use and steady is not None:
        per_microbatch = run.train.micro_batch_size * run.layout.dp
        last: deque[tuple[int, CriticalPathResult]] = deque(maxlen=3)
        ops = 0
        for count in steady.counts():
            short = run.model_copy(update={"train": run.train.model_copy(update={
                "global_batch_seqs": count * per_microbatch, "global_batch_tokens": None})})
            try:
                res = setup.evaluate(setup.lowered(short))
            except (InfeasibleLayout, ValueError):
                break
            ops += res.ops_evaluated
            last.append((count, res))
            if len(last) == 3:
                out = extend([r for _, r in last], steady.periods_added(count))
                if out is not None:
                    out.ops_evaluated = ops
                    out.note = (f"steady state: evaluated {last[0][0]}, {last[1][0]} and {last[2][0]} "
                                f"micro-batches and extended to {m}")
                    return out
    res = setup.evaluate(setup.lowered(run))
    res.note = f"every micro-batch ({m})"
    return res


class _NotSteady(Exception):
    """Three short runs not on one line."""


def _line(x1: float, x2: float, x3: float, k: int, tol: float) -> float:
    if (k + 1) * abs(x3 - 2.0 * x2 + x1) > tol:
        raise _NotSteady
    return x3 + k * (x3 - x2)


def _lines(ds: Sequence[dict[str, float]], k: int, tol: float) -> dict[str, float]:
    keys = list(dict.fromkeys([*ds[2], *ds[1], *ds[0]]))
    return {key: _line(ds[0].get(key, 0.0), ds[1].get(key, 0.0), ds[2].get(key, 0.0), k, tol) for key in keys}


def extend(results: Sequence[CriticalPathResult], k: int) -> CriticalPathResult | None:
    """The evaluation k pipeline periods beyond the last of three a period apart (every quantity
    extended linearly), or None when they are not on one line within ``steady.ERR_TOL``."""
    a, b, c = results
    t_tol = ERR_TOL * c.step_time_s
    m_tol = ERR_TOL * max(r.peak_bytes for r in results)
    inf = float("inf")
    try:
        stages = []
        for s1, s2, s3 in zip(a.stages, b.stages, c.stages, strict=True):
            three = (s1, s2, s3)
            peak = _line(s1.peak_bytes, s2.peak_bytes, s3.peak_bytes, k, m_tol)
            st = StageTimes(
                end_s=_line(s1.end_s, s2.end_s, s3.end_s, k, t_tol),
                busy_s=defaultdict(float, _lines([x.busy_s for x in three], k, t_tol)),
                exposed_s=defaultdict(float, _lines([x.exposed_s for x in three], k, inf)),
                bubble_s=_line(s1.bubble_s, s2.bubble_s, s3.bubble_s, k, inf),
                last_compute_end_s=_line(s1.last_compute_end_s, s2.last_compute_end_s, s3.last_compute_end_s, k, inf),
                last_axis=s3.last_axis, peak_bytes=peak,
                at_peak=_lines([x.at_peak for x in three], k, inf),
                flops=_line(s1.flops, s2.flops, s3.flops, k, inf))
            stages.append(st)
        step = _line(a.step_time_s, b.step_time_s, c.step_time_s, k, t_tol)
    except _NotSteady:
        return None
    return CriticalPathResult(step, stages)
