"""Layout search's evaluator: the lowered, costed program of one micro-batch per (stage, chunk), timed
by the critical-path evaluator, and the pipeline by the schedule's own action lists.

The engine and ``simtrain.engine.critical_path`` time every micro-batch of a step (or three short runs
of many); a search of thousands of layouts cannot afford either. Every micro-batch of a (stage, chunk)
runs the same ops, though, so this module

1. lowers, for each distinct stage (same layers per chunk and the same pipeline positions: the first,
   the last and the middle stages of an even split), a *probe*: the stage's actions of the first
   micro-batch each chunk runs, in the schedule's order (its F, B and, for a split backward, W), with
   the stage's step-level work around them (ZeRO-1/2 parameter gathers at the start; the gradient
   reductions, the embedding-gradient all-reduce and the optimizer at the end), exactly as
   ``simtrain.lower.lowering`` emits them (the same ``_StageLowering``), then costs it
   (``simtrain.cost.cost_pass``);
2. times the probes with ``critical_path.evaluate`` (the engine's uncontended plans; a probe's
   receives have no sender, so nothing waits on another stage) and reads off each action's duration,
   from the end of the previous action's last compute op to the end of its own: the action's compute
   plus the communication it exposes (TP/CP/EP inside its layers, ZeRO-3's per-layer gathers);
3. runs the schedule's action lists (``Schedule.actions``) through ``simtrain.plan.schedules.makespan``
   with those per-(stage, chunk) F/B/W costs, pipeline sends from the probe's send ops, and an
   overlapped F&B pair (DualPipe: one chain's communication beside the other's compute, DeepSeek-V3
   sec. 3.2.1) timed on its own small probe (a forward, then the pair as lowering interleaves it),
   resolved once per (schedule, pp, micro-batches, vpp)
   (``timing.compile_schedule``);
4. bounds each stage's step by its busiest communication stream (its per-micro-batch load times the
   micro-batches: ZeRO-2/3 reductions slower than the compute they hide behind queue up);
5. adds each stage's step-level work: the probe's waits in its first forward (ZeRO-1/2 parameter
   gathers, each layer waiting for its own buckets: only the first chunk's, as the later chunks' gathers
   hide behind earlier forwards) and its
   tail after its last backward (exposed gradient reduction, embedding sync, optimizer, a blocking
   parameter gather).

What it leaves out, and the engine models: contention between flows (a rank's own ZeRO-3 gathers and
reduce-scatters sharing its NIC, collectives slowing compute), and per-micro-batch differences
(ZeRO-2's reduce-scatter of every micro-batch is timed once, in the tail; a stage that keeps its
ZeRO-3 parameters gathered pays its gathers in every forward). ``benchmarks/evaluator_vs_engine.py``
reports the spread against the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from simtrain.cost.collectives import (
    collective_candidates,
    effective_bandwidth,
    idle_time,
    plan_send,
    unit_idle_times,
)
from simtrain.cost.cost_pass import cost_program
from simtrain.cost.costs import ComputeCostModel
from simtrain.cost.host import host_model_of, steady_host_gaps
from simtrain.engine.critical_path import CommTimer, evaluate
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import ClusterSpec, GpuSpec
from simtrain.lower.blocks import BlockBuilder
from simtrain.lower.layer_plan import LayerPlan, first_layers, recomputed_layers, split_layers
from simtrain.lower.lowering import _finish_stage, _param_gathers_at_start
from simtrain.lower.ops import CommOp, Op, Program, SendOp, Stream
from simtrain.lower.stage import _StageLowering
from simtrain.plan.layout import RankGrid, place
from simtrain.plan.routing import symmetric_load_factors
from simtrain.plan.schedules import Action, ActionCosts, schedule_of, split_backward_keys
from simtrain.plan.schedules.timing import CompiledSchedule, compile_schedule
from simtrain.spec.collective_kinds import Collective
from simtrain.spec.config import LayoutConfig, RunConfig

TP_AXES = ("tp", "cp")
COMPUTE_CATEGORIES = ("fwd", "bwd", "recompute")
EP_AXES = ("ep", "etp")
#: Layers of each kind (recomputed, plain) a truncated probe keeps per chunk (``_variants``).
TRUNCATED_LAYERS = 3


@lru_cache(maxsize=256)
def schedule_actions(kind: str, pp: int, microbatches: int, vpp: int) -> list[list[Action]]:
    """The schedule's action lists, memoised (DualPipe's construction is costly; read-only here)."""
    return schedule_of(kind).actions(pp, microbatches, vpp)


def probe_actions(actions: Sequence[Action]) -> list[Action]:
    """A stage's actions of the first micro-batch each of its chunks runs, in the schedule's order, none
    overlapped with a partner (its partner is another micro-batch)."""
    first: dict[int, int] = {}
    for a in actions:
        first[a.chunk] = min(first.get(a.chunk, a.microbatch), a.microbatch)
    return [a._replace(overlap_with_next=False) for a in actions if a.microbatch == first[a.chunk]]


class LineComm:
    """Collective and send times for probes, without the engine's symmetric copies: each (collective,
    group) is NCCL's best (algorithm, protocol) candidate for the group's placement at the op's size,
    latency + size x its idle-network time per byte (``simtrain.cost.collectives``, the functions the
    engine's ``CommPlanner`` plans with); a send, latency + its route's idle time. One instance serves
    every layout of a search on one cluster (``bind`` gives a layout's grid), its lines memoised.

    What it leaves out and the planner models: the flows of the other groups of a stage running the same
    collective on links this group uses (negligible where the groups tile nodes and rails); and it
    times every stage's collectives on stage 0's groups (their translates on a symmetric fabric)."""

    def __init__(self, topo: Fabric, gpu: GpuSpec):
        self.topo, self.gpu = topo, gpu
        self._lines: dict[tuple[Collective, tuple[int, ...]], tuple[tuple[float, float], ...]] = {}
        self._caps: dict[Any, float] = {}
        self.grid: RankGrid | None = None
        self.reps: list[int] = []
        self._memo: dict[tuple[Any, ...], float] = {}

    def bind(self, grid: RankGrid, reps: list[int]) -> LineComm:
        """Time the ops of a layout with this rank grid and these stage representatives."""
        self.grid, self.reps, self._memo = grid, reps, {}
        return self

    def _capacity(self, e: Any) -> float:
        c = self._caps.get(e)
        if c is None:
            c = self._caps[e] = effective_bandwidth(self.topo, self.gpu, e)
        return c

    def lines(self, coll: Collective, gpus: tuple[int, ...]) -> tuple[tuple[float, float], ...]:
        """(latency s, idle-network s per byte) of every candidate (algorithm, protocol) of ``coll`` on
        the GPUs ``gpus`` (memoised)."""
        key = (coll, gpus)
        lines = self._lines.get(key)
        if lines is None:
            cands = collective_candidates(coll, gpus, self.topo, self.gpu)
            units = unit_idle_times(cands, self._capacity)
            lines = self._lines[key] = tuple((c.latency_s, u) for c, u in zip(cands, units, strict=True))
        return lines

    def time(self, op: Op, stage: int) -> float:
        """Seconds of ``op`` (a collective or send) of ``stage``'s representative."""
        assert isinstance(op, CommOp) and self.grid is not None
        peer = op.peer_stage if isinstance(op, SendOp) else -1
        key = (op.coll, op.axis, op.comm_bytes, peer)
        t = self._memo.get(key)
        if t is not None:
            return t
        if isinstance(op, SendOp):
            plan = plan_send(place(self.reps[stage]), place(self.reps[peer]), op.comm_bytes, self.topo)
            t = plan.latency_s + idle_time(self._capacity, plan.phases)
        else:
            assert op.coll is not None
            # stage 0's group stands for every stage's (the stages' groups are translates of each other)
            group = tuple(place(r) for r in self.grid.group(op.axis, self.reps[0]))
            lines = self.lines(op.coll, group) if len(group) > 1 and op.comm_bytes > 0 else ()
            t = min((lat + u * op.comm_bytes for lat, u in lines), default=0.0)
        self._memo[key] = t
        return t

    def on_network(self, op: Op, stage: int) -> bool:
        """Whether ``op`` crosses nodes (its group, or its send's two ends, span more than one node)."""
        assert isinstance(op, CommOp) and self.grid is not None
        send = isinstance(op, SendOp)
        key = ("net", op.axis, stage if send else 0, op.peer_stage if isinstance(op, SendOp) else -1)
        hit = self._memo.get(key)
        if hit is None:
            if isinstance(op, SendOp):
                ranks: tuple[int, ...] = (self.reps[stage], self.reps[op.peer_stage])
            else:
                ranks = self.grid.group(op.axis, self.reps[0])
            hit = self._memo[key] = float(len({self.topo.node_of(place(r)) for r in ranks}) > 1)
        return bool(hit)


@dataclass(slots=True)
class StageProbe:
    """One stage's probe, timed (seconds).

    Attributes:
        costs: per chunk, the F/B/W durations and the pipeline send time (``ActionCosts``); ``fb_s``,
            where the schedule overlaps F&B, an overlapped pair with this chunk's forward
            (``lower_pair_probe``).
        compute_s: per chunk, the compute time of one micro-batch's F, B and W (recompute included).
        head_s: the wait before the first forward (ZeRO-1/2 parameter gathers).
        tail_s: from the end of the last action to the end of the stage's step.
        optimizer_s: the optimizer step (part of the tail).
        last_only_s: what a chunk's last backward takes beyond a steady one (DDP's bucket passes, waits
            for gradient reductions; part of the tail).
        stream_s: per chunk, the time each communication stream is busy over one micro-batch's actions.
        exposed_s: exposed communication by axis over the probe (its actions and tail).
        ops: ops lowered.
        cold_s: what the stage's first micro-batch idles more than a steady one, waiting for the CPU's
            issue from the step's empty launch queue (``simtrain.cost.host.steady_host_gaps``); paid once.
    """

    costs: list[ActionCosts] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    head_s: float = 0.0
    tail_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_s: dict[str, float] = field(default_factory=dict)
    ops: int = 0
    last_only_s: float = 0.0
    stream_s: list[dict[int, float]] = field(default_factory=list)
    cold_s: float = 0.0


def cost_probe(prog: Program, source: ComputeCostModel, cycle: slice) -> tuple[Program, float]:
    """``prog`` costed by ``source``, the host's GPU idle time (``simtrain.cost.host``) of ``prog.ops[cycle]``
    (one micro-batch's actions) that of the steady state of a step repeating them, not of a step's start;
    and what the first of them idles more from the step's empty queue, seconds."""
    costed = cost_program(prog, source, host_gaps=False)
    ops, cold = steady_host_gaps(costed.ops, host_model_of(source), cycle)
    return Program(costed.stage, ops, costed.static_mem), cold


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """A step evaluated from probes (seconds); the components add up to ``step_time_s`` on the
    critical stage (the one that ends last)."""

    step_time_s: float
    compute_s: float
    bubble_s: float
    tp_s: float
    """Exposed TP and CP communication inside the actions, over the step."""
    ep_s: float
    """Exposed EP/ETP communication inside the actions, over the step."""
    dp_s: float
    """Step-level data-parallel waits (head and tail, optimizer excluded) and ZeRO-3's in-action waits."""
    optimizer_s: float
    stage_end_s: tuple[float, ...]
    ops_evaluated: int


def stage_signatures(layers: list[list[int]], positions: list[list[int]], last: int) -> list[tuple[object, ...]]:
    """Per stage, the key of its probe: layers per chunk and, per chunk, whether it holds the first or
    the last pipeline position (embedding, head)."""
    return [(tuple(ls), tuple((v == 0, v == last) for v in pos)) for ls, pos in zip(layers, positions, strict=True)]


def lower_probe(run: RunConfig, stage: int, block: BlockBuilder, plans: dict[int, LayerPlan],
                actions: Sequence[Action], layers: list[int] | None = None, firsts: list[int] | None = None,
                last: bool = False) -> tuple[Program, list[tuple[Action, int, int]]]:
    """Lower ``stage``'s probe: ``actions`` (``probe_actions`` of its schedule) as lowering emits them,
    the program, hardware-neutral, and each action with the range of op indices it emitted.

    ``last`` False: the actions of a micro-batch in the steady state, after the step's parameter
    gathers (ZeRO-1/2) the first forward waits for. True: the step's end, each backward its chunk's last
    (gradient buckets, deferred reductions, the embedding-gradient all-reduce, the optimizer).
    ``layers``/``firsts``: layers per chunk and each chunk's first global layer (default: the layout's
    split; fewer layers make a truncated probe)."""
    lay = run.layout
    route = schedule_of(lay.resolved_schedule).route(lay.pp, 0, lay.vpp)
    if layers is None or firsts is None:
        split = split_layers(run.model.n_layers, lay.pp, lay.vpp, route)
        layers, firsts = split[stage], first_layers(split, route)[stage]
    sl = _StageLowering(run, stage, layers, plans, firsts, block, route, split_backward_keys(actions))
    if not last:
        _param_gathers_at_start(sl)
    spans = []
    for a in actions:
        start = len(sl.prog.ops)
        for _ in sl.steps(a, last and a.kind != "F"):
            pass
        spans.append((a, start, len(sl.prog.ops)))
    if last:
        _finish_stage(sl)
    return sl.prog, spans


def pair_types(actions: Sequence[Action]) -> list[tuple[int, int]]:
    """The (forward chunk, backward chunk) of each kind of overlapped F&B pair a stage runs (DualPipe)."""
    out: list[tuple[int, int]] = []
    for a, b in zip(actions, actions[1:], strict=False):
        if a.overlap_with_next and (a.chunk, b.chunk) not in out:
            out.append((a.chunk, b.chunk))
    return out


def lower_pair_probe(run: RunConfig, stage: int, block: BlockBuilder, plans: dict[int, LayerPlan],
                     pair: tuple[int, int], layers: list[int], firsts: list[int]) -> tuple[Program, int]:
    """Lower an overlapped F&B pair of ``stage`` (forward of chunk ``pair[0]``, backward of chunk
    ``pair[1]``) as lowering runs one (``_StageLowering.run_pair``), after the forward its backward
    needs: the program, hardware-neutral, and the index of the pair's first op."""
    lay = run.layout
    route = schedule_of(lay.resolved_schedule).route(lay.pp, 0, lay.vpp)
    sl = _StageLowering(run, stage, layers, plans, firsts, block, route, set())
    for _ in sl.steps(Action("F", 0, pair[1]), False):
        pass
    start = len(sl.prog.ops)
    sl.run_pair(sl.steps(Action("F", 1, pair[0]), False), sl.steps(Action("B", 0, pair[1]), False))
    return sl.prog, start


def time_pairs(programs: list[Program], starts: dict[int, int], grid: RankGrid, topo: Fabric,
               cluster: ClusterSpec, run: RunConfig, comm: CommTimer | None = None) -> dict[int, float]:
    """Per probed stage, the duration of its pair probe (``lower_pair_probe``): from the end of the
    forward before it to the pair's last compute op, seconds."""
    reps = [grid.representative(s) for s in range(len(programs))]
    if isinstance(comm, LineComm):
        comm.bind(grid, reps)
    res = evaluate(programs, grid, topo, cluster.gpu, None, symmetric_load_factors(run, reps), reps, comm,
                   share_nic=True)
    out = {}
    for s, i0 in starts.items():
        ops, ends = programs[s].ops, res.op_end_s[s]
        comp = [i for i, op in enumerate(ops) if op.stream == Stream.COMPUTE]
        before = max((ends[i] for i in comp if i < i0), default=0.0)
        out[s] = max(ends[i] for i in comp if i >= i0) - before
    return out


def time_probes(programs: list[Program], spans: dict[int, list[tuple[Action, int, int]]], grid: RankGrid,
                topo: Fabric, cluster: ClusterSpec, run: RunConfig,
                comm: CommTimer | None = None, head: bool = True) -> dict[int, StageProbe]:
    """Evaluate the costed probes (``programs``: one per stage, empty where not probed) with the
    critical-path evaluator and read each probed stage's action costs, head (``head``: the wait before
    the first action, under ZeRO-1/2 the step's parameter gathers) and tail (after the last action).
    ``comm``: what times communication (default: the engine's plans, ``critical_path``)."""
    reps = [grid.representative(s) for s in range(len(programs))]
    if isinstance(comm, LineComm):
        comm.bind(grid, reps)
    res = evaluate(programs, grid, topo, cluster.gpu, None, symmetric_load_factors(run, reps), reps, comm,
                   share_nic=True)
    zero12 = head and run.layout.shard_stage in (1, 2)
    out = {}
    for s, sp in spans.items():
        ops, starts, ends = programs[s].ops, res.op_start_s[s], res.op_end_s[s]
        n_chunks = 1 + max(a.chunk for a, _, _ in sp)
        dur: list[dict[str, float]] = [{} for _ in range(n_chunks)]
        busy = [0.0] * n_chunks
        p2p = [0.0] * n_chunks
        probe = StageProbe(ops=len(ops), stream_s=[{} for _ in range(n_chunks)])
        prev = 0.0
        # the step's parameter gathers, lowered before the first action; a layer's first forward waits
        # for its own buckets (``_StageLowering._gathers_for``)
        gathers = set(range(sp[0][1])) if zero12 and sp else set()
        for n, (a, i0, i1) in enumerate(sp):
            comp = [i for i in range(i0, i1) if ops[i].stream == Stream.COMPUTE]
            held = probe.stream_s[a.chunk]
            for i in range(i0, i1):
                if isinstance(ops[i], SendOp):
                    p2p[a.chunk] = max(p2p[a.chunk], ends[i] - starts[i])
                if ops[i].stream != Stream.COMPUTE:
                    held[ops[i].stream] = held.get(ops[i].stream, 0.0) + ends[i] - starts[i]
            if not comp:
                continue
            first, last = starts[comp[0]], ends[comp[-1]]
            gap = first - prev
            if zero12:  # the step's parameter gathers: the first forward waits, later ones hide
                waits = _gather_waits(ops, comp, starts, ends, gathers)
                probe.head_s += gap + waits if n == 0 else 0.0
                gap = -waits
            dur[a.chunk][a.kind] = dur[a.chunk].get(a.kind, 0.0) + gap + last - first
            busy[a.chunk] += sum(ends[i] - starts[i] for i in comp if ops[i].category in COMPUTE_CATEGORIES)
            prev = last
        st = res.stages[s]
        probe.tail_s = max(st.end_s - prev, 0.0)
        probe.optimizer_s = st.busy_s.get("optimizer", 0.0)
        probe.exposed_s = dict(st.exposed_s)
        for c in range(n_chunks):
            d = dur[c]
            probe.costs.append(ActionCosts(d.get("F", 0.0), d.get("B", 0.0), d.get("W", 0.0), None, p2p[c]))
            probe.compute_s.append(busy[c])
        out[s] = probe
    return out


def _gather_waits(ops: list[Op], comp: list[int], starts: list[float], ends: list[float], gathers: set[int]) -> float:
    """Seconds the compute ops ``comp`` (after the first) idle before those that wait for a parameter gather
    (an op of ``gathers``): the buckets a later layer of the first forward waits for, step-level work that
    the other micro-batches' forwards do not repeat."""
    out = 0.0
    for before, i in zip(comp, comp[1:], strict=False):
        if gathers.intersection(ops[i].deps):
            out += max(starts[i] - ends[before], 0.0)
    return out


def _add_tails(run: RunConfig, block: BlockBuilder, plans: dict[int, LayerPlan], full: list[list[Action]],
               probes: dict[int, StageProbe], grid: RankGrid, topo: Fabric, cluster: ClusterSpec,
               source: ComputeCostModel, comm: CommTimer | None) -> None:
    """Each probed stage's step end: its backward actions as the chunks' last (every layer: gradient
    buckets fill and reduce behind them, not linearly in the layers) and the step's closing work,
    lowered and timed; ``tail_s`` is what they take beyond the steady backwards the pipeline timed."""
    programs = [Program(s) for s in range(run.layout.pp)]
    spans = {}
    for s in probes:
        acts = [a for a in probe_actions(full[s]) if a.kind != "F"]
        prog, spans[s] = lower_probe(run, s, block, plans, acts, last=True)
        programs[s] = cost_probe(prog, source, slice(spans[s][0][1], spans[s][-1][2]))[0]
    for s, end in time_probes(programs, spans, grid, topo, cluster, run, comm, head=False).items():
        p = probes[s]
        steady = sum(c.b_s + c.w_s for c in p.costs)
        p.last_only_s = max(sum(c.b_s + c.w_s for c in end.costs) - steady, 0.0)
        p.tail_s = end.tail_s + p.last_only_s
        p.optimizer_s = end.optimizer_s
        p.ops += end.ops
        for axis, t in end.exposed_s.items():
            if axis not in TP_AXES + EP_AXES:
                p.exposed_s[axis] = p.exposed_s.get(axis, 0.0) + t


@lru_cache(maxsize=256)
def compiled_schedule(kind: str, pp: int, microbatches: int, vpp: int) -> CompiledSchedule:
    """The schedule's action lists resolved for timing (``timing.compile_schedule``), memoised: the
    layouts of one search share a few (schedule, pp, micro-batches, vpp)."""
    sched = schedule_of(kind)
    return compile_schedule(schedule_actions(kind, pp, microbatches, vpp), sched.route(pp, microbatches, vpp))


def pipeline_ends(kind: str, pp: int, m: int, vpp: int, costs: list[list[ActionCosts]]) -> tuple[float, ...]:
    """When each stage ends its last action (seconds from the first), the schedule's action lists run
    with ``costs[stage][chunk]`` (``simtrain.plan.schedules.makespan``)."""
    return compiled_schedule(kind, pp, m, vpp).stage_ends(costs)


@dataclass(frozen=True, slots=True)
class _Variant:
    """A probe of one stage with ``layers`` per chunk (full recompute of the first ``recompute_layers``
    of each), and how far to extrapolate from it: per chunk and for the stage as a whole."""

    layers: list[int]
    recompute_layers: int | None
    per_chunk: list[float]
    per_stage: float


def _variants(lay: LayoutConfig, plans: dict[int, LayerPlan], layers: list[int],
              firsts: list[int]) -> list[_Variant] | None:
    """The truncated probes of a stage whose chunks repeat one layer plan: B with at most
    ``TRUNCATED_LAYERS`` recomputed and as many plain layers per chunk, then one with a recomputed
    layer fewer and one with a plain layer fewer where the chunk has more (their differences from B
    are one layer's worth, extrapolated to the chunk's real counts: every quantity of an uncontended
    probe is linear in the layers of each kind). None when the stage must be probed whole: a chunk of
    mixed layer plans (dense and MoE, sliding and full attention), or CPU activation offloading (its
    copies follow a window of layers)."""
    if lay.offload_activation_layers or any(
            any(plans[f + i] is not plans[f] for i in range(n)) for n, f in zip(layers, firsts, strict=True)):
        return None
    rec = [recomputed_layers(lay, n) for n in layers]
    plain = [n - r for n, r in zip(layers, rec, strict=True)]
    t = TRUNCATED_LAYERS
    if max(max(rec), max(plain)) <= t:
        return None
    rb, ub = [min(r, t) for r in rec], [min(u, t) for u in plain]
    rl = None if lay.recompute_layers is None or lay.recompute != "full" else min(lay.recompute_layers, t)
    # (recomputed, plain) layers per chunk, the recompute_layers setting giving them, extrapolation
    wanted = [(rb, ub, rl, [0.0] * len(layers), 0.0)]
    cut_r, cut_u = [r > t for r in rec], [u > t for u in plain]
    if any(cut_r):
        excess = [float(r - b) for r, b in zip(rec, rb, strict=True)]
        wanted.append(([b - c for b, c in zip(rb, cut_r, strict=True)], ub, None if rl is None else rl - 1, excess,
                       sum(excess) / sum(cut_r)))
    if any(cut_u):
        excess = [float(u - b) for u, b in zip(plain, ub, strict=True)]
        wanted.append((rb, [b - c for b, c in zip(ub, cut_u, strict=True)], rl, excess, sum(excess) / sum(cut_u)))
    out = []
    for rs, us, v_rl, per_chunk, per_stage in wanted:
        counts = [r + u for r, u in zip(rs, us, strict=True)]
        probe_lay = lay.model_copy(update={"recompute_layers": v_rl})
        if [recomputed_layers(probe_lay, n) for n in counts] != rs:  # the setting cannot give this split
            return None
        out.append(_Variant(counts, v_rl, per_chunk, per_stage))
    return out


def _combine(probes: list[StageProbe], variants: list[_Variant]) -> StageProbe:
    """Probe B extrapolated by each other probe's one-layer difference (``_variants``)."""
    b = probes[0]
    out = StageProbe(list(b.costs), list(b.compute_s), b.head_s, b.tail_s, b.optimizer_s, dict(b.exposed_s),
                     sum(p.ops for p in probes), b.last_only_s, [dict(d) for d in b.stream_s], b.cold_s)
    for p, v in zip(probes[1:], variants[1:], strict=True):
        k = v.per_stage
        out.head_s += k * (b.head_s - p.head_s)
        out.cold_s += k * (b.cold_s - p.cold_s)
        out.tail_s += k * (b.tail_s - p.tail_s)
        out.optimizer_s += k * (b.optimizer_s - p.optimizer_s)
        out.last_only_s += k * (b.last_only_s - p.last_only_s)
        for axis in set(b.exposed_s) | set(p.exposed_s):
            out.exposed_s[axis] = out.exposed_s.get(axis, 0.0) + k * (b.exposed_s.get(axis, 0.0)
                                                                      - p.exposed_s.get(axis, 0.0))
        for c, kc in enumerate(v.per_chunk):
            cb, cp_ = b.costs[c], p.costs[c]
            old = out.costs[c]
            fb = None if old.fb_s is None or cb.fb_s is None or cp_.fb_s is None else old.fb_s + kc * (cb.fb_s - cp_.fb_s)
            out.costs[c] = ActionCosts(old.f_s + kc * (cb.f_s - cp_.f_s), old.b_s + kc * (cb.b_s - cp_.b_s),
                                       old.w_s + kc * (cb.w_s - cp_.w_s), fb, old.p2p_s)
            out.compute_s[c] += kc * (b.compute_s[c] - p.compute_s[c])
            for q, t in b.stream_s[c].items():
                out.stream_s[c][q] += kc * (t - p.stream_s[c].get(q, 0.0))
    return out


def evaluate_layout(run: RunConfig, cluster: ClusterSpec, topo: Fabric, cost: ComputeCostModel,
                    block: BlockBuilder, plans: dict[int, LayerPlan],
                    comm: CommTimer | None = None) -> ProbeResult:
    """One step of ``run`` (a valid layout of its model on ``cluster``) from its probes (module docstring).

    ``block`` and ``plans``: the layout's ``build_block`` and ``layer_plans`` (the caller caches them
    across layouts of one shape). ``comm``: what times communication (default: a ``LineComm``; a
    ``critical_path`` planner-based timer adds the symmetric copies' sharing, at a cost)."""
    lay = run.layout
    m = run.train.global_batch_seqs_resolved // (run.train.micro_batch_size * lay.dp)
    kind = lay.resolved_schedule
    sched = schedule_of(kind)
    full = schedule_actions(kind, lay.pp, m, lay.vpp)
    route = sched.route(lay.pp, m, lay.vpp)
    layers = split_layers(run.model.n_layers, lay.pp, lay.vpp, route)
    positions = [[route.position(0, s, c) for c in range(len(layers[s]))] for s in range(lay.pp)]
    sigs = stage_signatures(layers, positions, route.length - 1)
    probed: dict[tuple[object, ...], int] = {}
    for s, sig in enumerate(sigs):
        probed.setdefault(sig, s)
    source = replace(cost, host_Bps=cluster.node.host_link_Bps) if cluster.node.host_link_Bps > 0 else cost
    grid = RankGrid(lay)
    comm = comm or LineComm(topo, cluster.gpu)
    firsts = first_layers(layers, route)
    variants = {s: _variants(lay, plans, layers[s], firsts[s]) for s in probed.values()}
    rounds = max((len(v) for v in variants.values() if v), default=1)
    pairs = {s: pair_types(full[s]) for s in probed.values()}
    timed: dict[int, list[StageProbe]] = {s: [] for s in probed.values()}
    for r in range(rounds):
        programs = [Program(s) for s in range(lay.pp)]
        spans = {}
        cold_of: dict[int, float] = {}
        for s in probed.values():
            vs = variants[s]
            if (vs is None and r > 0) or (vs is not None and r >= len(vs)):
                continue
            if vs is None:
                prog, spans[s] = lower_probe(run, s, block, plans, probe_actions(full[s]))
            else:
                v = vs[r]
                vrun = run.model_copy(update={"layout": lay.model_copy(update={"recompute_layers": v.recompute_layers})})
                prog, spans[s] = lower_probe(vrun, s, block, plans, probe_actions(full[s]), v.layers, firsts[s])
            programs[s], cold_of[s] = cost_probe(prog, source, slice(spans[s][0][1], None))
        got = time_probes(programs, spans, grid, topo, cluster, run, comm)
        for k in range(max((len(p) for p in pairs.values()), default=0)):  # overlapped F&B pairs
            pair_programs = [Program(s) for s in range(lay.pp)]
            starts = {}
            for s in spans:
                if k < len(pairs[s]):
                    vs = variants[s]
                    vrun, vlayers = (run, layers[s]) if vs is None else (run.model_copy(update={
                        "layout": lay.model_copy(update={"recompute_layers": vs[r].recompute_layers})}), vs[r].layers)
                    prog, starts[s] = lower_pair_probe(vrun, s, block, plans, pairs[s][k], vlayers, firsts[s])
                    pair_programs[s] = cost_probe(prog, source, slice(starts[s], None))[0]
            for s, fb in time_pairs(pair_programs, starts, grid, topo, cluster, run, comm).items():
                cf = pairs[s][k][0]
                got[s].costs[cf] = got[s].costs[cf]._replace(fb_s=fb)
        for s, probe in got.items():
            probe.cold_s = cold_of[s]
            timed[s].append(probe)
    probes = {}
    for s, rounds_of_s in timed.items():
        vs = variants[s]
        probes[s] = rounds_of_s[0] if vs is None else _combine(rounds_of_s, vs)
    _add_tails(run, block, plans, full, probes, grid, topo, cluster, source, comm)
    per_stage = [probes[probed[sig]] for sig in sigs]
    ends = pipeline_ends(kind, lay.pp, m, lay.vpp, [p.costs for p in per_stage])
    head = per_stage[0].head_s
    # the first stage's first micro-batch, issued from the step's empty launch queue, idles longer and
    # delays every stage; a later stage's CPU issues its start while its GPU waits for the first receive
    # (``simtrain.cost.host.RunAhead``); the first stage's CPU, too, issues while its GPU waits for the head's
    # parameter gathers
    cold = max(per_stage[0].cold_s - head, 0.0)
    runs = sched.chunk_runs(m)
    paced = [head + cold + e + p.tail_s for e, p in zip(ends, per_stage, strict=True)]
    # a communication stream cannot carry more than the step: per-micro-batch reductions or gathers
    # slower than the compute they overlap (ZeRO-2/3 over a slow network) queue up behind it
    backlog = [head + runs * max((sum(d.get(q, 0.0) for d in p.stream_s) for q in {q for d in p.stream_s for q in d}),
                                 default=0.0) for p in per_stage]
    totals = [max(a, b) for a, b in zip(paced, backlog, strict=True)]
    step = max(totals)
    crit = totals.index(step)
    p = per_stage[crit]
    compute = runs * sum(p.compute_s) + cold  # the host's GPU idle time counts as compute, as in the actions
    busy = runs * sum(c.f_s + c.b_s + c.w_s for c in p.costs)
    tp = runs * sum(p.exposed_s.get(a, 0.0) for a in TP_AXES)
    ep = runs * sum(p.exposed_s.get(a, 0.0) for a in EP_AXES)
    dp = max(busy - compute - tp - ep, 0.0) + head + p.tail_s - p.optimizer_s + (step - paced[crit])
    bubble = max(step - compute - tp - ep - dp - p.optimizer_s, 0.0)
    return ProbeResult(step, compute, bubble, tp, ep, dp, p.optimizer_s, tuple(totals),
                       sum(pr.ops for pr in probes.values()))
