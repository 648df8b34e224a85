"""The pieces the closed-form estimate (simtrain.studies.estimate) composes: per-layer and per-chunk times, the
pipeline timings (1F1B closed form, other schedules through their action lists), the FSDP gather/reduce
timeline, and the single-chunk memory peak (seconds, bytes)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from simtrain.lower.blocks import TP_OVERLAP_CHUNKS, leading_gemms
from simtrain.lower.layer_plan import (
    recomputed_layers,
)
from simtrain.lower.memory import (
    ChunkMemory,
    activation_shape,
)
from simtrain.lower.ops import Kernel
from simtrain.plan.schedules import (
    Action,
    ActionCosts,
    Route,
    Schedule,
    makespan,
    schedule_of,
)
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.spec.model import ModelSpec


def _tp_pipelined_s(seg: tuple[Kernel, ...], before: float | None, after: float | None) -> float:
    """Exposed time of TP collectives pipelined in n chunks with the GEMMs they are fused with (the
    engine's ``_Emitter._overlapped``): chunk i of an all-gather ``before`` (a per chunk) feeds GEMM chunk i
    (g per chunk), so max(n a + g, a + n g) - n g = max(T - (n-1) g, a) is exposed; a reduce-scatter
    ``after`` fed by the trailing GEMMs is the mirror image. Without a GEMM next to it a collective waits
    (or is waited for) whole."""
    n = TP_OVERLAP_CHUNKS
    lead, trail = leading_gemms(seg, gathered=True), leading_gemms(seg[::-1])
    exposed = 0.0
    for total, gemms in ((before, seg[:lead]), (after, seg[len(seg) - trail:])):
        if total is None:
            continue
        gemm = sum(x.time_s for x in gemms)
        exposed += max(total - (n - 1) * gemm / n, total / n) if gemms else total
    return exposed


@dataclass(frozen=True, slots=True)
class _LayerTimes:
    """One micro-batch through one layer on one rank, seconds: compute, exposed comm (TP/CP and
    EP/ETP apart), the weight-gradient GEMMs inside the backward, and selective recompute."""

    fwd_s: float
    bwd_s: float
    fwd_comm_s: float
    bwd_comm_s: float
    fwd_ep_s: float
    bwd_ep_s: float
    wgrad_s: float
    selective_s: float

    @property
    def fwd_total_s(self) -> float:
        """Forward with its exposed communication."""
        return self.fwd_s + self.fwd_comm_s + self.fwd_ep_s

    @property
    def bwd_total_s(self) -> float:
        """Backward with its exposed communication."""
        return self.bwd_s + self.bwd_comm_s + self.bwd_ep_s


@dataclass(frozen=True, slots=True)
class _EdgeTimes:
    """Embedding (forward + backward), head (forward + backward) and MTP projection times, seconds."""

    emb_s: float
    head_s: float
    mtp_proj_fwd_s: float
    mtp_proj_bwd_s: float


@dataclass(slots=True)
class _ChunkCost:
    """One micro-batch through one (stage, chunk): forward, backward, its weight-gradient part, the
    exposed comm inside them (TP/CP, EP), seconds."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    wgrad_s: float = 0.0
    comm_s: float = 0.0
    ep_s: float = 0.0


_Pipe = tuple[float, float, float, float, float, float]
"""A pipeline's (compute, bubble, TP/CP comm, EP comm, forward and backward per micro-batch), seconds."""


def _layer_run(model: ModelSpec, layout: LayoutConfig, train: TrainConfig) -> RunConfig:
    """A RunConfig of an already-valid (model, layout, train) without re-validation (lowering's
    plan functions read only these three)."""
    return RunConfig.model_construct(model=model, layout=layout, train=train)


def _plan_key(model: ModelSpec, layout: LayoutConfig, train: TrainConfig) -> tuple[object, ...]:
    """What a layer plan depends on: the activation shape, precision, stack, CP/EP/ETP, overlap and
    the selective-recompute modules (full recompute is applied per layer by the stage, not the plan)."""
    rec = layout.recompute if layout.recompute in ("selective", "op_sac") else "none"
    modules = layout.recompute_modules if rec == "selective" else ()
    dualpipe = schedule_of(layout.resolved_schedule).overlaps_forward_backward  # F&B overlap
    return (activation_shape(train, layout, model), train.precision, train.fp8_recipe, train.stack, layout.cp,
            layout.cp_comm, layout.ep, layout.expert_tp, layout.ep_comm_overlap or dualpipe, rec, modules,
            layout.tp_comm_overlap)


@dataclass(frozen=True, slots=True)
class _Structure:
    """Where the layers sit: the schedule's route, layers per (stage, chunk) and each chunk's first
    global layer (``lowering.split_layers`` / ``first_layers``)."""

    route: Route
    layers: list[list[int]]
    firsts: list[list[int]]

    def chunk(self, s: int, c: int) -> range:
        """Global layer indices of (stage, chunk), in forward order."""
        return range(self.firsts[s][c], self.firsts[s][c] + self.layers[s][c])

    def position(self, s: int, c: int) -> int:
        """Model stage (position on the path) of (stage, chunk)."""
        return self.route.position(0, s, c)


def _heaviest(stages: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """The (dense, expert) parameter pairs of the stages no other stage exceeds in both (DP and
    optimizer times grow with each, so only these can be the slowest)."""
    pairs = {(d, e) for d, e, _ in stages}
    return [p for p in pairs if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in pairs)]


def _edp(layout: LayoutConfig) -> int:
    """Expert-data-parallel degree: tp x cp x dp / (ep x etp) (``lowering._StageLowering.edp``)."""
    return max(layout.expert_data_degree, 1)


_FsdpAction = tuple[float, list[float], list[float], list[float], float]
"""One action under ZeRO-3: (compute before its layers, each layer's compute, gathers and
reduce-scatters in execution order, compute after its layers), seconds."""


def _fsdp_timeline(actions: list[_FsdpAction], prefetch: int) -> float:
    """Seconds from the first action's start to the last reduce-scatter's end, the actions run back to
    back on the compute stream with lowering's ZeRO-3 ops (``_StageLowering._fsdp_gather`` /
    ``_fsdp_reduce``): layer j's gathers are issued with layer j - prefetch, once the compute before
    that layer has ended, in order on the gather stream; layer j computes once layer j - 1 has and
    its gathers are done; its reduce-scatter is queued on the DP stream when it ends. The two streams
    share the links: while both have an op running, each gets half the bandwidth (max-min fair
    sharing of an edge by two flows, ``simtrain.engine.network``; both cross the same NICs when the data and
    expert-data groups span nodes); otherwise the running one gets it all.
    """
    gq: deque[list[float]] = deque()  # [ready time, work left] of issued gathers, in stream order
    rq: deque[list[float]] = deque()
    clock = [0.0, 0]  # link time, gathers completed (they complete in issue order)

    def advance(until: float, gather_id: int = -1) -> float:
        """Run the link to ``until`` or until gather ``gather_id`` is done; the time reached."""
        lt = float(clock[0])
        while (gq or rq) and (lt < until or clock[1] <= gather_id):
            heads = [q for q in (gq, rq) if q and q[0][0] <= lt]
            pending = [q[0][0] for q in (gq, rq) if q and q[0][0] > lt]
            if not heads:
                nxt = min(pending)
                if nxt >= until and clock[1] > gather_id:
                    lt = until
                    break
                lt = nxt
                continue
            rate = 1.0 / len(heads)
            step = min(q[0][1] / rate for q in heads)
            if pending:
                step = min(step, min(pending) - lt)
            if clock[1] > gather_id:
                step = min(step, until - lt)
            lt += step
            for q in heads:
                q[0][1] -= step * rate
                if q[0][1] <= 1e-15:
                    q.popleft()
                    if q is gq:
                        clock[1] += 1
        clock[0] = max(lt, float(clock[0]))
        return float(clock[0])

    t = 0.0
    issued = 0
    for pre, compute, gather, reduce, post in actions:
        t += pre
        ids = [-1] * len(compute)
        nxt = 0
        for j, c in enumerate(compute):
            while nxt < len(compute) and nxt <= j + prefetch:
                if gather[nxt] > 0:
                    advance(t)
                    gq.append([t, gather[nxt]])
                    ids[nxt] = issued
                    issued += 1
                nxt += 1
            if ids[j] >= 0:
                t = max(t, advance(t, ids[j]))
            t += c
            if reduce[j] > 0:
                advance(t)
                rq.append([t, reduce[j]])
        t += post
    return max(t, advance(float("inf")))


def _chunk_cost(times: list[_LayerTimes], v: int, last: int, layout: LayoutConfig, edge: _EdgeTimes,
                mtp: list[_LayerTimes]) -> _ChunkCost:
    """One micro-batch through a chunk: its layers (full recompute re-runs the forward of its first
    ``recompute_layers``; selective recompute its plan's kernels), the embedding on the first model
    stage (half in forward, half in backward), the head (a third in forward) and MTP blocks on the last."""
    cc = _ChunkCost()
    rec = recomputed_layers(layout, len(times))
    selective = layout.recompute in ("selective", "op_sac")
    for j, t in enumerate(times):
        again = j < rec
        cc.fwd_s += t.fwd_total_s
        cc.bwd_s += t.bwd_total_s + (t.fwd_total_s if again else 0.0) + (t.selective_s if selective else 0.0)
        cc.wgrad_s += t.wgrad_s
        cc.comm_s += t.fwd_comm_s + t.bwd_comm_s + (t.fwd_comm_s if again else 0.0)
        cc.ep_s += t.fwd_ep_s + t.bwd_ep_s + (t.fwd_ep_s if again else 0.0)
    if v == 0:
        cc.fwd_s += edge.emb_s / 2
        cc.bwd_s += edge.emb_s / 2
    if v == last:
        cc.fwd_s += edge.head_s / 3
        cc.bwd_s += 2 * edge.head_s / 3
        for t in mtp:  # DeepSeek-V3 sec. 2.2: projection, block and the shared head per MTP module
            cc.fwd_s += edge.mtp_proj_fwd_s + t.fwd_total_s + edge.head_s / 3
            cc.bwd_s += edge.mtp_proj_bwd_s + t.bwd_total_s + 2 * edge.head_s / 3
            cc.comm_s += t.fwd_comm_s + t.bwd_comm_s
            cc.ep_s += t.fwd_ep_s + t.bwd_ep_s
    return cc


def _pipeline_1f1b(layout: LayoutConfig, costs: list[list[_ChunkCost]],
                   m: int) -> _Pipe:
    """(compute, bubble, TP/CP comm, EP comm, slowest stage's forward and backward per micro-batch)
    of 1F1B, interleaved 1F1B or GPipe: m x the slowest stage plus (p - 1)/v x the mean stage
    (Narayanan et al. 2021 sec. 2.2)."""
    stage_s = [sum(c.fwd_s + c.bwd_s for c in row) for row in costs]
    i = max(range(len(stage_s)), key=stage_s.__getitem__)
    compute = m * stage_s[i]
    bubble = (layout.pp - 1) / layout.vpp * sum(stage_s) / len(stage_s)
    comm = m * sum(c.comm_s for c in costs[i])
    ep = m * sum(c.ep_s for c in costs[i])
    return compute, bubble, comm, ep, sum(c.fwd_s for c in costs[i]), sum(c.bwd_s for c in costs[i])


def _pipeline_scheduled(layout: LayoutConfig, sched: Schedule, costs: list[list[_ChunkCost]],
                        m: int) -> _Pipe:
    """As ``_pipeline_1f1b`` for ZB-H1, DualPipe and DualPipeV: the schedule executed by
    ``schedules.makespan`` with each (stage, chunk)'s F, B (input gradients) and W (weight
    gradients); an overlapped F&B pair costs its two computes, or its communication where that is
    longer (each chain's
    all-to-alls run while the other computes: DeepSeek-V3 sec. 3.2.1). Past ``Schedule.steady_microbatches``
    the makespan and busy times grow linearly (steady state), so they are extrapolated from two
    short schedules (exact for ZB-H1, within 3 % for DualPipe and DualPipeV on 16 stages with uneven
    stages)."""
    p = layout.pp

    def action_costs(s: int, c: int) -> ActionCosts:
        cc = costs[s][c]
        comm = cc.comm_s + cc.ep_s
        fb = max(cc.fwd_s + cc.bwd_s - comm, comm) if sched.overlaps_forward_backward else None
        return ActionCosts(cc.fwd_s, cc.bwd_s - cc.wgrad_s, cc.wgrad_s, fb)

    def timed(n: int) -> tuple[float, tuple[float, ...]]:
        t = makespan(_schedule(sched.kind, p, n, 1), action_costs, sched.route(p, n))
        return t.makespan_s, t.busy_s

    cut = sched.steady_microbatches(p)
    if m <= cut + 2:
        total, busy = timed(m)
    else:
        (t1, b1), (t2, b2) = timed(cut), timed(cut + 2)
        total = t1 + (m - cut) / 2 * (t2 - t1)
        busy = tuple(x + (m - cut) / 2 * (y - x) for x, y in zip(b1, b2, strict=True))
    i = max(range(p), key=busy.__getitem__)
    share = sched.chunk_runs(m)
    plain = share * sum(c.fwd_s + c.bwd_s for c in costs[i])
    hidden = busy[i] / plain if plain > 0 else 1.0  # overlapped pairs hide their communication
    comm = hidden * share * sum(c.comm_s for c in costs[i])
    ep = hidden * share * sum(c.ep_s for c in costs[i])
    per_mb = share / m  # chunks a micro-batch passes on this stage: DualPipe 1 of its 2, DualPipeV both
    return (busy[i], total - busy[i], comm, ep, per_mb * sum(c.fwd_s for c in costs[i]),
            per_mb * sum(c.bwd_s for c in costs[i]))


@lru_cache(maxsize=256)
def _schedule(kind: str, pp: int, microbatches: int, vpp: int) -> list[list[Action]]:
    """The schedule's action lists, memoised (DualPipe's construction is costly; read-only here)."""
    return schedule_of(kind).actions(pp, microbatches, vpp)


def single_chunk_peak(mem: ChunkMemory, in_flight: int) -> float:
    """Peak of a one-chunk 1F1B (or GPipe) stage with ``in_flight`` micro-batches alive at most.

    Each forward leaves A = its net bytes; the peak comes during the last forward before the first
    backward, (n - 1) A + (forward's running maximum), or during the first backward,
    n A + (backward's running maximum); later steady-state steps repeat those levels. Equals
    ``closed_form_peak`` on the full schedule (tested), in O(layers) instead of O(micro-batches x layers).
    """
    def walk(deltas: list[tuple[float, float]]) -> tuple[float, float]:
        live = top = 0.0
        for start, end in deltas:
            live += start
            top = max(top, live)
            live += end
            top = max(top, live)
        return live, top

    net, fwd_top = walk(mem.fwd)
    _, bwd_top = walk(mem.bwd)
    n = max(in_flight, 1)
    return max((n - 1) * net + fwd_top, n * net + bwd_top)


def _peak_microbatches(layout: LayoutConfig, microbatches: int) -> int:
    """Micro-batches of the schedule the memory walk needs (``Schedule.peak_microbatches``): 1F1B holds
    at most p - s in flight, reached before the (p + 1)-th micro-batch; interleaved 1F1B within 4 x p;
    ZB-H1, DualPipe and DualPipeV by ``Schedule.steady_microbatches``; GPipe all of them."""
    return schedule_of(layout.resolved_schedule).peak_microbatches(layout.pp, microbatches)
