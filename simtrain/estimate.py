"""Closed-form estimate of a step's time and per-stage peak memory, without the engine.

Used by the layout search to rank and prune thousands of layouts before simulating the best few.
It reuses the simulator's own cost pieces, so the two agree where the closed form is exact:

- compute: the kernels ``simtrain.blocks`` builds for one layer, embedding and head at the layout's
  shape (GEMM tile/wave efficiency included), times layers per stage, plus the recomputed forwards;
- TP/DP collectives: the (algorithm, protocol) NCCL would pick for the group's placement and its
  idle-network time (``simtrain.collectives``); PP sends: latency + bytes over the route;
- pipeline: micro-batches x the slowest stage's micro-batch time, plus the fill/drain bubble
  (p - 1)/v x the mean stage time (Narayanan et al. 2021 sec. 2.2: bubble fraction (p - 1)/(v m));
- DP overlap: the gradient reduction hides behind the last micro-batch's backward (Megatron DDP
  buckets), the ZeRO-1/2 parameter all-gather behind the first forward, the ZeRO-3 per-layer gathers
  behind each layer's compute;
- memory: ``simtrain.memory``'s static state and per-op activation deltas walked over the stage's
  schedule, exactly as the engine's closed-form cross-check does (on a schedule cut to the
  micro-batches past which a 1F1B/interleaved peak no longer grows).

It ignores contention between concurrent flows, compute slowed by overlapped communication, and the
exact dependency timing; the search simulates its best candidates to get those right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.blocks import BlockBuilder, Comm, Ring, Segment
from simtrain.collectives import (
    collective_candidates,
    effective_bandwidth,
    idle_time,
    plan_send,
    unit_idle_times,
)
from simtrain.config import LayoutConfig, TrainConfig
from simtrain.costs import ComputeCostModel
from simtrain.flops import model_flops_per_step
from simtrain.hardware import ClusterSpec, Topology
from simtrain.layout import RankGrid
from simtrain.lowering import split_layers
from simtrain.memory import (
    ChunkMemory,
    activation_shape,
    backward_transient_bytes,
    closed_form_peak,
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_checkpoint_bytes,
    static_memory,
)
from simtrain.model import ModelSpec
from simtrain.profile import compute_calibration
from simtrain.schedules import build_schedule

MiB = 1024.0**2
PEAK_MICROBATCHES_PER_STAGE = 4  # the 1F1B/interleaved peak is reached within 4 x pp micro-batches


@dataclass(frozen=True, slots=True)
class Estimate:
    """Closed-form step estimate (seconds) and per-stage peak memory (bytes, fragmentation included)."""

    step_time_s: float
    compute_s: float
    bubble_s: float
    tp_s: float
    """Exposed TP and CP communication (both live inside the layer's segments)."""
    pp_s: float
    dp_s: float
    optimizer_s: float
    stage_peak_bytes: tuple[float, ...]
    capacity_bytes: float
    mfu: float

    @property
    def peak_bytes(self) -> float:
        """Largest stage peak, bytes."""
        return max(self.stage_peak_bytes)

    @property
    def fits(self) -> bool:
        """Every stage's peak fits in HBM."""
        return self.peak_bytes <= self.capacity_bytes

    def components(self) -> dict[str, float]:
        """Where the estimated time goes, seconds, by cause (compute, bubble, comm per axis, optimizer)."""
        return {"compute": self.compute_s, "bubble": self.bubble_s, "tp/cp comm": self.tp_s, "pp comm": self.pp_s,
                "dp comm": self.dp_s, "optimizer": self.optimizer_s}


@dataclass(frozen=True, slots=True)
class _LayerTimes:
    """One micro-batch through one layer/embedding/head on one rank: compute and TP comm, seconds."""

    fwd_s: float
    bwd_s: float
    fwd_tp_s: float
    bwd_tp_s: float
    emb_s: float
    head_s: float
    selective_s: float


@dataclass(slots=True)
class Estimator:
    """Estimates layouts of one model on one cluster; caches per-shape and per-group costs."""

    model: ModelSpec
    cluster: ClusterSpec
    fragmentation_ratio: float = 0.05
    topo: Topology = field(init=False)
    _layers: dict[tuple[object, ...], _LayerTimes] = field(default_factory=dict)
    _colls: dict[tuple[str, tuple[int, ...]], tuple[tuple[float, float], ...]] = field(default_factory=dict)
    _dynamic: dict[tuple[object, ...], tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.topo = Topology(self.cluster)

    # -- costs -----------------------------------------------------------------------------------
    def collective_s(self, kind: str, group: tuple[int, ...], size_bytes: float) -> float:
        """Time of one collective on ``group``: min over NCCL's candidates of latency + size x s/byte."""
        if len(group) < 2 or size_bytes <= 0:
            return 0.0
        key = (kind, group)
        lines = self._colls.get(key)
        if lines is None:
            gpu = self.cluster.gpu
            cands = collective_candidates(kind, group, self.topo, gpu)
            units = unit_idle_times(cands, lambda e: effective_bandwidth(self.topo, gpu, e))
            lines = self._colls[key] = tuple((c.latency_s, u) for c, u in zip(cands, units, strict=True))
        return min(lat + u * size_bytes for lat, u in lines)

    def _send_s(self, src: int, dst: int, size_bytes: float) -> float:
        plan = plan_send(src, dst, size_bytes, self.topo)
        gpu = self.cluster.gpu
        return plan.latency_s + idle_time(lambda e: effective_bandwidth(self.topo, gpu, e), plan.phases)

    def _segments_s(self, segs: list[Segment], groups: dict[str, tuple[int, ...]]) -> tuple[float, float]:
        """(compute, exposed comm) of a segment list; an overlapped collective costs only what
        exceeds the compute segment it runs beside."""
        compute = comm = 0.0
        hidden = 0.0
        for s in segs:
            if isinstance(s, Ring):
                # ring attention: block i+1 waits for KV block i's transfer, which runs beside block i
                block = sum(k.time_s for k in s.kernels)
                hop = self.collective_s(s.comm.coll, groups.get(s.comm.axis, ()), s.comm.size_bytes)
                compute += s.steps * block
                comm += (s.steps - 1) * max(hop - block, 0.0)
            elif isinstance(s, Comm):
                t = self.collective_s(s.coll, groups.get(s.axis, ()), s.size_bytes)
                if s.overlap:
                    hidden = t
                else:
                    comm += t
            else:
                t = sum(k.time_s for k in s)
                compute += t
                comm += max(hidden - t, 0.0)
                hidden = 0.0
        return compute, comm + hidden

    def cost_model(self, precision: str) -> ComputeCostModel:
        """The compute cost model ``simulate`` uses for this GPU (calibrated when the profile is)."""
        return ComputeCostModel(self.cluster.gpu, precision, calibration=compute_calibration(self.cluster.gpu))

    def layer_times(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid) -> _LayerTimes:
        """Per-micro-batch times of a layer, the embedding and the head at this layout's shape (cached)."""
        shape = activation_shape(train, layout, self.model)
        groups = {axis: grid.group(axis, 0) for axis in ("tp", "cp")}
        key = (shape, train.precision, layout.cp_comm, groups["tp"], groups["cp"])
        hit = self._layers.get(key)
        if hit is not None:
            return hit
        blk = BlockBuilder(self.model, self.cost_model(train.precision), shape.b, shape.s, shape.t, shape.sp,
                           shape.flash, shape.dropout, layout.cp, layout.cp_comm)
        f, f_tp = self._segments_s(blk.layer_forward(), groups)
        b, b_tp = self._segments_s(blk.layer_backward(), groups)
        emb = sum(self._segments_s(blk.embedding_forward() + blk.embedding_backward(), groups))
        head = sum(self._segments_s(blk.head_forward() + blk.head_backward(), groups))
        selective = sum(k.time_s for k in blk.attention_core_recompute()) if not shape.flash else 0.0
        out = self._layers[key] = _LayerTimes(f, b, f_tp, b_tp, emb, head, selective)
        return out

    # -- memory ----------------------------------------------------------------------------------
    def stage_params(self, layout: LayoutConfig) -> list[float]:
        """Parameters on one rank of each stage (TP-sharded), as lowering places them."""
        m, tp = self.model, layout.tp
        layers = split_layers(m.n_layers, layout.pp, layout.vpp)
        n_virtual = layout.pp * layout.vpp
        out = []
        for s, chunks in enumerate(layers):
            total = sum(chunks) * m.layer_params() / tp
            for c in range(len(chunks)):
                v = c * layout.pp + s
                if v == 0:
                    total += (m.embedding_params() + m.position_params()) / tp
                if v == n_virtual - 1:
                    head = m.lm_head_params() or (m.embedding_params() if n_virtual > 1 else 0)
                    total += head / tp + m.final_norm_params()
            out.append(total)
        return out

    def stage_memory(self, layout: LayoutConfig, train: TrainConfig, microbatches: int) -> tuple[float, ...]:
        """Peak bytes of each stage, fragmentation included (``simtrain.memory``'s closed form)."""
        m = self.model
        layers = split_layers(m.n_layers, layout.pp, layout.vpp)
        shard = layout.fsdp_shard_size if layout.fsdp == "hybrid" and layout.fsdp_shard_size else layout.data_degree
        context = self.cluster.gpu.cuda_context_bytes + self.cluster.gpu.nccl_buffer_bytes
        dynamic = self.dynamic_peaks(layout, train, microbatches)
        out = []
        for s, params in enumerate(self.stage_params(layout)):
            static = static_memory(params, m.layer_params() / layout.tp, sum(layers[s]), layout, train, shard, context)
            out.append((sum(static.values()) + dynamic[s]) * (1 + self.fragmentation_ratio))
        return tuple(out)

    def dynamic_peaks(self, layout: LayoutConfig, train: TrainConfig, microbatches: int) -> tuple[float, ...]:
        """Peak activation/backward bytes per stage (independent of ZeRO, so cached without it)."""
        key = (layout.tp, layout.pp, layout.vpp, layout.cp, layout.sequence_parallel, layout.recompute,
               layout.recompute_layers, layout.resolved_schedule, train.micro_batch_size, train.seq_len,
               train.attention_kernel, train.dropout, microbatches)
        hit = self._dynamic.get(key)
        if hit is not None:
            return hit
        m = self.model
        shape = activation_shape(train, layout, m)
        selective = layout.recompute == "selective" and not shape.flash
        act = layer_activation_bytes(m, shape, recompute_attention=selective)
        ckpt, transient = layer_checkpoint_bytes(m, shape), backward_transient_bytes(m, shape)
        emb, head = embedding_activation_bytes(m, shape), head_activation_bytes(m, shape)
        layers = split_layers(m.n_layers, layout.pp, layout.vpp)
        kind = layout.resolved_schedule
        n_virtual = layout.pp * layout.vpp
        schedule = None
        if kind == "interleaved_1f1b":
            schedule = build_schedule(kind, layout.pp, min(microbatches, _peak_microbatches(layout)), layout.vpp)
        out = []
        for s in range(layout.pp):
            chunks = {c: _chunk_memory(layers[s][c], c * layout.pp + s, n_virtual, layout, act, ckpt, transient,
                                       emb, head) for c in range(len(layers[s]))}
            if schedule is not None:
                out.append(closed_form_peak(schedule[s], chunks))
            else:
                in_flight = microbatches if kind == "gpipe" else min(layout.pp - s, microbatches)
                out.append(single_chunk_peak(chunks[0], in_flight))
        result = self._dynamic[key] = tuple(out)
        return result

    # -- time ------------------------------------------------------------------------------------
    def estimate(self, layout: LayoutConfig, train: TrainConfig) -> Estimate:
        """Estimate one step of a valid layout (see the module docstring for the model)."""
        grid = RankGrid(layout)
        seqs = train.global_batch_seqs_resolved
        m = seqs // (train.micro_batch_size * layout.dp)
        lt = self.layer_times(layout, train, grid)
        layers = split_layers(self.model.n_layers, layout.pp, layout.vpp)
        stage_s, fwd_mb, bwd_mb = self._stage_times(layout, lt, layers)
        t_max, t_mean = max(stage_s), sum(stage_s) / len(stage_s)
        compute = m * t_max
        bubble = (layout.pp - 1) / layout.vpp * t_mean
        tp_layer = lt.fwd_tp_s + lt.bwd_tp_s
        tp_s = m * max(sum(c) for c in layers) * tp_layer  # TP comm is already inside the stage times
        pp_s = self._pp_s(layout, grid, train, m)
        params = max(self.stage_params(layout))
        dp_s = self._dp_s(layout, train, grid, params, m, fwd_mb, bwd_mb, lt)
        opt_s = self._optimizer_s(layout, train, params)
        step = compute + bubble + pp_s + dp_s + opt_s
        tokens = seqs * train.seq_len
        flops = model_flops_per_step(self.model, train.seq_len, tokens)
        peak = self.cluster.gpu.peak_flops_per_s(train.precision)
        mem = self.stage_memory(layout, train, m)
        return Estimate(step, compute - tp_s, bubble, tp_s, pp_s, dp_s, opt_s, mem, self.cluster.gpu.hbm_bytes,
                        flops / (step * self.cluster.n_gpus * peak))

    def _stage_times(self, layout: LayoutConfig, lt: _LayerTimes,
                     layers: list[list[int]]) -> tuple[list[float], float, float]:
        """Per-stage time of one micro-batch (all chunks), and the slowest stage's forward/backward parts."""
        n_virtual = layout.pp * layout.vpp
        out, fwds, bwds = [], [], []
        for s, chunks in enumerate(layers):
            fwd = bwd = 0.0
            for c, n in enumerate(chunks):
                v = c * layout.pp + s
                rec = _recomputed_layers(layout, n)
                fwd += n * (lt.fwd_s + lt.fwd_tp_s) + (lt.emb_s / 2 if v == 0 else 0.0)
                fwd += lt.head_s / 3 if v == n_virtual - 1 else 0.0
                bwd += n * (lt.bwd_s + lt.bwd_tp_s) + rec * (lt.fwd_s + lt.fwd_tp_s) + (lt.emb_s / 2 if v == 0 else 0.0)
                bwd += 2 * lt.head_s / 3 if v == n_virtual - 1 else 0.0
                bwd += n * lt.selective_s if layout.recompute == "selective" else 0.0
            out.append(fwd + bwd)
            fwds.append(fwd)
            bwds.append(bwd)
        i = max(range(len(out)), key=out.__getitem__)
        return out, fwds[i], bwds[i]

    def _pp_s(self, layout: LayoutConfig, grid: RankGrid, train: TrainConfig, m: int) -> float:
        """Exposed pipeline sends: one activation/gradient transfer per virtual micro-batch boundary."""
        if layout.pp == 1:
            return 0.0
        size = 2.0 * train.micro_batch_size * (train.seq_len // layout.cp) * self.model.hidden / layout.tp
        peer = grid.group("pp", 0)[1]
        return (m * layout.vpp + layout.pp - 1) * self._send_s(0, peer, size)

    def _dp_s(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid, params: float, m: int,
              fwd_mb: float, bwd_mb: float, lt: _LayerTimes) -> float:
        """Exposed data-parallel communication (gradient reduction, parameter gathers)."""
        if layout.dp * layout.cp == 1:
            return 0.0
        group = grid.group("dp_cp" if layout.cp > 1 else "dp", 0)  # grads and ZeRO span dp x cp
        grad_b = 4.0 if train.grad_dtype == "fp32" else 2.0
        stage = layout.shard_stage
        if stage >= 3:
            # Mirrors lowering (FSDP2 prefetch): gathers run on their own stream, issued
            # ``fsdp_prefetch_layers`` layers ahead, so each action's first gather is exposed and a
            # later one only where it outlasts the layer it hides behind (backward: sharing the links
            # with the reduce-scatters); without prefetch every gather is exposed. The last layer's
            # reduce-scatter is exposed before the optimizer.
            lp = self.model.layer_params() / layout.tp
            ag = self.collective_s("all_gather", group, 2.0 * lp)
            rs = self.collective_s("reduce_scatter", group, grad_b * lp)
            n_layers = max(sum(c) for c in split_layers(self.model.n_layers, layout.pp, layout.vpp))
            if layout.fsdp_prefetch_layers == 0:
                return m * n_layers * 2 * ag + rs
            fwd_l, bwd_l = lt.fwd_s + lt.fwd_tp_s, lt.bwd_s + lt.bwd_tp_s
            per_layer = max(ag - fwd_l, 0.0) + max(ag + rs - bwd_l, 0.0)
            return m * (2 * ag + max(n_layers - 1, 0) * per_layer) + rs
        bucket = layout.grad_bucket_MiB * MiB
        coll = "all_reduce" if stage == 0 else "reduce_scatter"
        reduce_s = self._bucketed_s(coll, group, grad_b * params, bucket)
        last = self.collective_s(coll, group, min(bucket, grad_b * params))
        if not layout.overlap_grad_reduce:
            exposed = reduce_s
        elif layout.vpp > 1 and stage != 2:
            # Interleaved: each chunk reduces as its last backward ends; only the last chunk's share
            # (1/v) has no backward left to hide behind.
            exposed = reduce_s / layout.vpp + last
        elif stage == 2:
            # ZeRO-2 reduce-scatters every micro-batch; nothing waits for it before the optimizer, so
            # it hides behind all the compute after the first backward.
            exposed = max(m * reduce_s - (m * (fwd_mb + bwd_mb) - fwd_mb), 0.0) + last
        else:
            exposed = max(reduce_s - bwd_mb, 0.0) + last
        if stage in (1, 2):
            gather_s = self._bucketed_s("all_gather", group, 2.0 * params, bucket)
            # Lowering issues every chunk's gather at the start and a chunk's first forward waits for
            # its own share: interleaved, the first chunk's 1/v is exposed and the rest hides behind
            # earlier chunks; otherwise the gather mostly overlaps the first forward (calibrated
            # against the engine).
            if not layout.overlap_param_gather:
                exposed += gather_s
            else:
                exposed += gather_s / layout.vpp if layout.vpp > 1 else max(gather_s - fwd_mb, 0.0)
        return exposed

    def _bucketed_s(self, coll: str, group: tuple[int, ...], total_bytes: float, bucket_bytes: float) -> float:
        full, rest = divmod(total_bytes, bucket_bytes)
        return full * self.collective_s(coll, group, bucket_bytes) + self.collective_s(coll, group, rest)

    def _optimizer_s(self, layout: LayoutConfig, train: TrainConfig, params: float) -> float:
        """Fused optimizer step as lowering charges it (bytes moved through HBM)."""
        grad_b = 4.0 if train.grad_dtype == "fp32" else 2.0
        per_param = grad_b + (24.0 + 2.0 if train.optimizer != "sgd" else 16.0 + 2.0)
        shard = layout.data_degree if layout.shard_stage >= 1 else 1
        return self.cost_model(train.precision).memory_op("optimizer.step", per_param * params / shard).time_s


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


def _peak_microbatches(layout: LayoutConfig) -> int:
    """Micro-batches past which a stage's peak stops growing: 1F1B holds at most p - s in flight,
    reached before the (p + 1)-th micro-batch; interleaved warm-up is (p - s - 1) * 2 + (v - 1) * p
    virtual micro-batches, so 4 x p micro-batches cover it and one steady period (tested against the
    engine's closed form on full schedules)."""
    if layout.resolved_schedule == "interleaved_1f1b":
        return PEAK_MICROBATCHES_PER_STAGE * layout.pp
    return layout.pp + 1


def _recomputed_layers(layout: LayoutConfig, n_layers: int) -> int:
    if layout.recompute != "full":
        return 0
    return n_layers if layout.recompute_layers is None else min(layout.recompute_layers, n_layers)


def _chunk_memory(n_layers: int, v: int, n_virtual: int, layout: LayoutConfig, act: float, ckpt: float,
                  transient: float, emb: float, head: float) -> ChunkMemory:
    """Ledger deltas of one chunk, op by op, as ``simtrain.lowering`` attaches them."""
    mem = ChunkMemory()
    rec = _recomputed_layers(layout, n_layers)
    if v == 0:
        mem.fwd.append((emb, 0.0))
    for i in range(n_layers):
        mem.fwd.append((act, -(act - ckpt)) if i < rec else (act, 0.0))
    if v == n_virtual - 1:
        mem.fwd.append((head, 0.0))
        mem.bwd.append((0.0, -head))
    for i in reversed(range(n_layers)):
        if i < rec:
            mem.bwd.append((act, 0.0))
            mem.bwd.append((transient, -(ckpt + act + transient)))
        else:
            mem.bwd.append((transient, -(act + transient)))
    if v == 0:
        mem.bwd.append((0.0, -emb))
    return mem
