"""Lowering: (model, layout, train, grid) -> one op program per pipeline stage.

``lower`` is a dispatcher over small helpers: the schedule gives each stage its ordered actions;
each forward/backward action emits the embedding/layers/head segments of ``blocks``; pipeline sends
follow each action; data-parallel gradient reduction is bucketed and overlapped with backward
(Megatron-LM DDP / PyTorch DDP buckets), ZeRO-1/2 reduce-scatter gradients and all-gather
parameters, ZeRO-3/FSDP all-gather each layer's parameters before its forward and backward (with
prefetch) and reduce-scatter its gradients; the optimizer step closes the program. Ranks of one
stage differ only by their dp/tp coordinates, so one program serves them all (symmetric) and full
mode runs it on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.blocks import BlockBuilder, Comm, Ring, Segment
from simtrain.config import RunConfig
from simtrain.costs import ComputeCostModel
from simtrain.memory import (
    ChunkMemory,
    activation_shape,
    backward_transient_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_checkpoint_bytes,
)
from simtrain.ops import Kernel, Op, OpKind, Program, Stream
from simtrain.schedules import Action, build_schedule

MiB = 1024.0**2
STREAM_OF_AXIS = {"tp": Stream.TP, "cp": Stream.CP, "ep": Stream.EP}
TP_OVERLAP_CHUNKS = 4  # Megatron TP-comm overlap splits each GEMM/collective pair into chunks


def split_layers(n_layers: int, pp: int, vpp: int) -> list[list[int]]:
    """Layers per (stage, chunk). Even when divisible; otherwise (vpp=1) the first and last stages
    give up layers first, since they also hold the embedding and the LM head (Llama 3 405B removes
    one layer from each of them; Dubey et al. 2024 sec. 3.3.2)."""
    if n_layers % (pp * vpp) == 0:
        return [[n_layers // (pp * vpp)] * vpp for _ in range(pp)]
    base = -(-n_layers // pp)
    counts = [base] * pp
    deficit = pp * base - n_layers
    order = [i for pair in zip(range(pp), reversed(range(pp)), strict=True) for i in pair]
    for i in order[:deficit] if deficit <= pp else order:
        counts[i] -= 1
    return [[c] for c in counts]


@dataclass(slots=True)
class LayerPlan:
    """Per-layer costs and memory deltas shared by every layer of the model."""

    fwd: list[Segment]
    bwd: list[Segment]
    act_bytes: float
    ckpt_bytes: float
    transient_bytes: float
    params_per_rank: float
    selective_kernels: tuple[Kernel, ...] = ()


@dataclass(slots=True)
class Lowered:
    """Everything lowering produces: programs, schedule, and memory facts for the closed form."""

    programs: list[Program]
    schedule: list[list[Action]]
    chunk_memory: list[dict[int, ChunkMemory]]
    layers: list[list[int]]
    microbatches: int
    stage_params: list[float] = field(default_factory=list)


class _Emitter:
    """Appends ops to one program, tracking the data dependency between streams."""

    def __init__(self, prog: Program, tp_overlap: bool):
        self.prog = prog
        self.tp_overlap = tp_overlap
        self.last_compute: int | None = None
        self.pending_comm: Op | None = None
        self.pending_comm_spec: tuple[str, float, str, int, int] | None = None
        self.recv_key: tuple[str, int, int] | None = None
        self.recv_ops: dict[int, tuple[str, int, int]] = {}
        self.extra_deps: list[int] = []

    def comm(self, c: Comm, category: str, mb: int, chunk: int) -> None:
        """A collective after the last compute op; the next compute op waits for it."""
        if self.tp_overlap and c.axis == "tp":
            self.pending_comm_spec = (c.coll, c.size_bytes, category, mb, chunk)
            return
        deps = [] if self.last_compute is None else [self.last_compute]
        if self.pending_comm is not None:  # two collectives in a row: the second follows the first
            deps.append(self.pending_comm.idx)
        self.pending_comm = self.prog.add(OpKind.COLLECTIVE, STREAM_OF_AXIS[c.axis], f"{c.axis}.{c.coll}",
                                          category="comm", deps=tuple(deps), coll=c.coll, axis=c.axis,
                                          comm_bytes=c.size_bytes, microbatch=mb, chunk=chunk)

    def ring(self, r: Ring, category: str, mb: int, chunk: int) -> None:
        """Ring attention: compute block i while KV block i moves on; block i+1 waits for that move."""
        prev_comm = self.pending_comm
        for i in range(r.steps):
            recv = prev_comm
            if i < r.steps - 1:
                deps = [d.idx for d in (prev_comm,) if d is not None] or (
                    [] if self.last_compute is None else [self.last_compute])
                prev_comm = self.prog.add(OpKind.COLLECTIVE, STREAM_OF_AXIS[r.comm.axis],
                                          f"{r.comm.axis}.{r.comm.coll}", category="comm", deps=tuple(deps),
                                          coll=r.comm.coll, axis=r.comm.axis, comm_bytes=r.comm.size_bytes,
                                          microbatch=mb, chunk=chunk)
            self.pending_comm = recv
            self.compute(r.kernels, category, mb, chunk)
        self.pending_comm = None

    def compute(self, kernels: tuple[Kernel, ...], category: str, mb: int, chunk: int,
                mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> Op | None:
        """A compute op (or, with TP overlap pending, a chunked comm/compute pipeline)."""
        if not kernels:
            return None
        if self.pending_comm_spec is not None:
            return self._overlapped(kernels, category, mb, chunk, mem_start, mem_end, tag)
        deps = list(self.extra_deps)
        if self.pending_comm is not None:
            deps.append(self.pending_comm.idx)
            self.pending_comm = None
        self.extra_deps = []
        op = self.prog.add(OpKind.COMPUTE, Stream.COMPUTE, kernels[0].name if len(kernels) == 1 else
                           f"{category}:{kernels[0].name}..{kernels[-1].name}", category=category,
                           deps=tuple(deps), duration_s=sum(k.time_s for k in kernels),
                           kernels=kernels, microbatch=mb, chunk=chunk,
                           mem_start=((tag, mem_start),) if mem_start else (),
                           mem_end=((tag, mem_end),) if mem_end else ())
        if self.recv_key is not None:
            self.recv_ops[op.idx] = self.recv_key
            self.recv_key = None
        self.last_compute = op.idx
        return op

    def _overlapped(self, kernels: tuple[Kernel, ...], category: str, mb: int, chunk: int,
                    mem_start: float, mem_end: float, tag: str) -> Op | None:
        assert self.pending_comm_spec is not None
        coll, size, _, _, _ = self.pending_comm_spec
        self.pending_comm_spec = None
        n = TP_OVERLAP_CHUNKS
        part = tuple(Kernel(k.name, k.flops / n, k.bytes / n, k.time_s / n) for k in kernels)
        op = None
        for i in range(n):
            deps = () if self.last_compute is None else (self.last_compute,)
            self.pending_comm = self.prog.add(OpKind.COLLECTIVE, Stream.TP, f"tp.{coll}", category="comm",
                                              deps=deps, coll=coll, axis="tp", comm_bytes=size / n,
                                              microbatch=mb, chunk=chunk)
            op = self.compute(part, category, mb, chunk, mem_start if i == 0 else 0.0,
                              mem_end if i == n - 1 else 0.0, tag)
        return op

    def segments(self, segs: list[Segment], category: str, mb: int, chunk: int,
                 mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> None:
        """Emit a segment list; ``mem_start`` goes on its first compute op, ``mem_end`` on its last."""
        computes = [i for i, s in enumerate(segs) if isinstance(s, tuple) and s]
        for i, s in enumerate(segs):
            if isinstance(s, Comm):
                self.comm(s, category, mb, chunk)
            elif isinstance(s, Ring):
                self.ring(s, category, mb, chunk)
            elif s:
                self.compute(s, category, mb, chunk, mem_start if i == computes[0] else 0.0,
                             mem_end if i == computes[-1] else 0.0, tag)


@dataclass(slots=True)
class _StageLowering:
    """Builds the program of one pipeline stage."""

    run: RunConfig
    stage: int
    layers: list[int]
    plan: LayerPlan
    block: BlockBuilder
    cost: ComputeCostModel
    n_virtual: int
    prog: Program = field(init=False)
    em: _Emitter = field(init=False)
    sends: dict[tuple[str, int, int], int] = field(default_factory=dict)
    dp_ops: list[int] = field(default_factory=list)
    deferred: list[tuple[str, float]] = field(default_factory=list)
    param_gathers: dict[int, list[int]] = field(default_factory=dict)
    fsdp_gathers: dict[tuple[str, int, int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prog = Program(self.stage)
        self.em = _Emitter(self.prog, self.run.layout.tp_comm_overlap and self.run.layout.tp > 1)

    # -- helpers -------------------------------------------------------------------------------
    @property
    def pp(self) -> int:
        return self.run.layout.pp

    def vstage(self, chunk: int) -> int:
        """Virtual stage index of ``chunk`` on this stage (Megatron: chunk * pp + stage)."""
        return chunk * self.pp + self.stage

    def _recompute_layer(self, i: int) -> bool:
        lay = self.run.layout
        if lay.recompute != "full":
            return False
        return lay.recompute_layers is None or i < lay.recompute_layers

    def _embed_params(self, chunk: int) -> float:
        """Input-embedding parameters on this rank for a chunk (TP-sharded; first virtual stage)."""
        m = self.run.model
        return (m.embedding_params() + m.position_params()) / self.run.layout.tp if self.vstage(chunk) == 0 else 0.0

    def _head_params(self, chunk: int) -> float:
        """LM-head + final-norm parameters on this rank (last virtual stage; a tied head keeps a copy
        of the embedding when it is on another stage, as Megatron does)."""
        m = self.run.model
        if self.vstage(chunk) != self.n_virtual - 1:
            return 0.0
        head = m.lm_head_params() or (m.embedding_params() if self.n_virtual > 1 else 0)
        return head / self.run.layout.tp + m.final_norm_params()

    def _extra_params(self, chunk: int) -> float:
        return self._embed_params(chunk) + self._head_params(chunk)

    def chunk_params(self, chunk: int) -> float:
        """Parameters of one chunk on this rank."""
        return self.layers[chunk] * self.plan.params_per_rank + self._extra_params(chunk)

    # -- forward / backward --------------------------------------------------------------------
    def forward(self, a: Action, is_last_mb: bool) -> None:
        v = self.vstage(a.chunk)
        em, plan = self.em, self.plan
        if v > 0:
            em.recv_key = ("F", a.microbatch, v)
        if self.gathers_before(a.chunk, a.microbatch):
            em.extra_deps = list(self.param_gathers.get(a.chunk, []))
        if v == 0:
            em.segments(self.block.embedding_forward(), "fwd", a.microbatch, a.chunk,
                        mem_start=embedding_activation_bytes(self.run.model, self._shape))
        for i in range(self.layers[a.chunk]):
            self._fsdp_gather("F", a, i)
            if self._recompute_layer(i):
                em.segments(plan.fwd, "fwd", a.microbatch, a.chunk, mem_start=plan.act_bytes,
                            mem_end=-(plan.act_bytes - plan.ckpt_bytes))
            else:
                em.segments(plan.fwd, "fwd", a.microbatch, a.chunk, mem_start=plan.act_bytes)
        if v == self.n_virtual - 1:
            em.segments(self.block.head_forward(), "fwd", a.microbatch, a.chunk,
                        mem_start=head_activation_bytes(self.run.model, self._shape))
        else:
            self._send("F", a, v + 1)

    def backward(self, a: Action, is_last_mb: bool) -> None:
        v = self.vstage(a.chunk)
        em, plan = self.em, self.plan
        m = self.run.model
        if v < self.n_virtual - 1:
            em.recv_key = ("B", a.microbatch, v)
        else:
            em.segments(self.block.head_backward(), "bwd", a.microbatch, a.chunk,
                        mem_end=-head_activation_bytes(m, self._shape))
        bucket = BucketFiller(self, a, is_last_mb)
        bucket.add(self._head_params(a.chunk))
        for i in reversed(range(self.layers[a.chunk])):
            self._fsdp_gather("B", a, i)
            rec = self._recompute_layer(i)
            keep = plan.ckpt_bytes if rec else plan.act_bytes
            if rec:
                em.segments(plan.fwd, "recompute", a.microbatch, a.chunk, mem_start=plan.act_bytes)
            elif plan.selective_kernels and self.run.layout.recompute == "selective":
                em.compute(plan.selective_kernels, "recompute", a.microbatch, a.chunk)
            freed = keep + (plan.act_bytes if rec else 0.0) + plan.transient_bytes
            em.segments(plan.bwd, "bwd", a.microbatch, a.chunk, mem_start=plan.transient_bytes, mem_end=-freed)
            self._fsdp_reduce(a, i, is_last_mb)
            bucket.add(plan.params_per_rank)
        if v == 0:
            em.segments(self.block.embedding_backward(), "bwd", a.microbatch, a.chunk,
                        mem_end=-embedding_activation_bytes(m, self._shape))
            bucket.add(self._embed_params(a.chunk))
        bucket.flush()
        if v > 0:
            self._send("B", a, v - 1)

    @property
    def _shape(self):  # type: ignore[no-untyped-def]
        return activation_shape(self.run.train, self.run.layout, self.run.model)

    def _send(self, kind: str, a: Action, dst_v: int) -> None:
        """Pipeline send of this action's output (activations or input gradients) to ``dst_v``."""
        lay = self.run.layout
        size = 2.0 * self.block.T * self.run.model.hidden / lay.tp
        deps = () if self.em.last_compute is None else (self.em.last_compute,)
        op = self.prog.add(OpKind.SEND, Stream.PP, f"pp.send.{kind}", category="comm", deps=deps, coll="send",
                           axis="pp", comm_bytes=size, peer_stage=dst_v % self.pp, microbatch=a.microbatch,
                           chunk=a.chunk)
        self.sends[(kind, a.microbatch, dst_v)] = op.idx

    # -- data parallelism ----------------------------------------------------------------------
    def gathers_before(self, chunk: int, mb: int) -> bool:
        return mb == 0 and chunk in self.param_gathers

    def dp_collective(self, coll: str, axis: str, size: float, name: str, deps: tuple[int, ...]) -> Op:
        op = self.prog.add(OpKind.COLLECTIVE, Stream.DP, name, category="comm", deps=deps, coll=coll,
                           axis=axis, comm_bytes=size)
        self.dp_ops.append(op.idx)
        return op

    def _fsdp_gather(self, kind: str, a: Action, i: int) -> None:
        """ZeRO-3/FSDP: all-gather layer i's parameters (prefetched ``fsdp_prefetch_layers`` ahead)."""
        lay = self.run.layout
        if lay.shard_stage < 3 or lay.data_degree == 1:
            return
        size = 2.0 * self.plan.params_per_rank
        axis = "dp_shard" if lay.fsdp == "hybrid" else lay.data_axis
        deps = () if self.em.last_compute is None else (self.em.last_compute,)
        op = self.dp_collective("all_gather", axis, size, f"fsdp.all_gather.{kind}", deps)
        self.em.extra_deps = [*self.em.extra_deps, op.idx]

    def _fsdp_reduce(self, a: Action, i: int, is_last_mb: bool) -> None:
        lay = self.run.layout
        if lay.shard_stage < 3 or lay.data_degree == 1:
            return
        grad_b = 4.0 if self.run.train.grad_dtype == "fp32" else 2.0
        size = grad_b * self.plan.params_per_rank
        deps = (self.em.last_compute,) if self.em.last_compute is not None else ()
        if lay.fsdp == "hybrid" and lay.fsdp_shard_size and lay.fsdp_shard_size < lay.dp:
            op = self.dp_collective("reduce_scatter", "dp_shard", size, "fsdp.reduce_scatter", deps)
            if is_last_mb:
                self.dp_collective("all_reduce", "dp_replicate", size / lay.fsdp_shard_size,
                                   "fsdp.all_reduce.replicas", (op.idx,))
        else:
            self.dp_collective("reduce_scatter", lay.data_axis, size, "fsdp.reduce_scatter", deps)


@dataclass(slots=True)
class BucketFiller:
    """Groups gradients into buckets in backward order and reduces each as it fills (DDP buckets)."""

    sl: _StageLowering
    action: Action
    is_last_mb: bool
    pending: float = 0.0

    @property
    def active(self) -> bool:
        lay = self.sl.run.layout
        if lay.data_degree == 1 or lay.shard_stage >= 3:
            return False
        return self.is_last_mb or lay.shard_stage == 2

    def add(self, params: float) -> None:
        if not self.active or params <= 0:
            return
        self.pending += params
        if self.pending * self._grad_bytes >= self.sl.run.layout.grad_bucket_MiB * MiB:
            self.flush()

    @property
    def _grad_bytes(self) -> float:
        return 4.0 if self.sl.run.train.grad_dtype == "fp32" else 2.0

    def flush(self) -> None:
        if not self.active or self.pending <= 0:
            return
        lay = self.sl.run.layout
        coll = "all_reduce" if lay.shard_stage == 0 else "reduce_scatter"
        size = self.pending * self._grad_bytes
        last = self.sl.em.last_compute
        if lay.overlap_grad_reduce:
            self.sl.dp_collective(coll, lay.data_axis, size, f"dp.{coll}", () if last is None else (last,))
        else:
            self.sl.deferred.append((coll, size))
        self.pending = 0.0


def _finish_stage(sl: _StageLowering) -> None:
    """Deferred gradient reductions, the optimizer step and (ZeRO-1/2) the parameter all-gather."""
    lay, train = sl.run.layout, sl.run.train
    last = sl.em.last_compute
    for coll, size in sl.deferred:
        sl.dp_collective(coll, lay.data_axis, size, f"dp.{coll}", () if last is None else (last,))
    params = sum(sl.chunk_params(c) for c in range(len(sl.layers)))
    shard = lay.data_degree if lay.shard_stage >= 1 else 1
    if lay.fsdp == "hybrid" and lay.fsdp_shard_size:
        shard = lay.fsdp_shard_size
    # Fused Adam reads grad, fp32 master, m, v and writes master, m, v and the bf16 weights
    # (4+4+4+4 read + 4+4+4+2 write bytes/param); SGD with momentum drops v.
    grad_b = 4.0 if train.grad_dtype == "fp32" else 2.0
    per_param = grad_b + (24.0 + 2.0 if train.optimizer != "sgd" else 16.0 + 2.0)
    kernel = sl.cost.memory_op("optimizer.step", per_param * params / shard)
    deps = (sl.dp_ops[-1],) if sl.dp_ops else ()
    sl.em.pending_comm = None
    sl.em.extra_deps = list(deps)
    opt = sl.em.compute((kernel,), "optimizer", -1, 0)
    assert opt is not None
    if lay.shard_stage in (1, 2) and lay.data_degree > 1 and not lay.overlap_param_gather:
        sl.dp_collective("all_gather", lay.data_axis, 2.0 * params, "dp.param_all_gather", (opt.idx,))


def _param_gathers_at_start(sl: _StageLowering) -> None:
    """ZeRO-1/2 with overlapped parameter gather: the previous step's updated parameters are
    all-gathered bucket by bucket while this step's forward runs (Megatron --overlap-param-gather);
    each chunk's first forward waits for its buckets."""
    lay = sl.run.layout
    if lay.shard_stage not in (1, 2) or lay.data_degree == 1 or not lay.overlap_param_gather:
        return
    bucket = lay.grad_bucket_MiB * MiB
    for c in range(len(sl.layers)):
        size = 2.0 * sl.chunk_params(c)
        ids = []
        while size > 0:
            part = min(size, bucket)
            ids.append(sl.dp_collective("all_gather", lay.data_axis, part, "dp.param_all_gather", ()).idx)
            size -= part
        sl.param_gathers[c] = ids


def _layer_plan(run: RunConfig, block: BlockBuilder) -> LayerPlan:
    shape = activation_shape(run.train, run.layout, run.model)
    selective = run.layout.recompute == "selective" and not shape.flash
    return LayerPlan(
        fwd=block.layer_forward(), bwd=block.layer_backward(),
        act_bytes=layer_activation_bytes(run.model, shape, recompute_attention=selective),
        ckpt_bytes=layer_checkpoint_bytes(run.model, shape),
        transient_bytes=backward_transient_bytes(run.model, shape),
        params_per_rank=run.model.layer_params() / run.layout.tp,
        selective_kernels=block.attention_core_recompute() if selective else (),
    )


def _chunk_memory(sl: _StageLowering, chunk: int) -> ChunkMemory:
    """The ledger deltas of one chunk, from the memory formulas (for the closed-form peak)."""
    plan, shape, m = sl.plan, sl._shape, sl.run.model
    mem = ChunkMemory()
    v = sl.vstage(chunk)
    if v == 0:
        mem.fwd.append((embedding_activation_bytes(m, shape), 0.0))
    for i in range(sl.layers[chunk]):
        if sl._recompute_layer(i):
            mem.fwd.append((plan.act_bytes, -(plan.act_bytes - plan.ckpt_bytes)))
        else:
            mem.fwd.append((plan.act_bytes, 0.0))
    if v == sl.n_virtual - 1:
        mem.fwd.append((head_activation_bytes(m, shape), 0.0))
        mem.bwd.append((0.0, -head_activation_bytes(m, shape)))
    for i in reversed(range(sl.layers[chunk])):
        if sl._recompute_layer(i):
            mem.bwd.append((plan.act_bytes, 0.0))
            mem.bwd.append((plan.transient_bytes, -(plan.ckpt_bytes + plan.act_bytes + plan.transient_bytes)))
        else:
            mem.bwd.append((plan.transient_bytes, -(plan.act_bytes + plan.transient_bytes)))
    if v == 0:
        mem.bwd.append((0.0, -embedding_activation_bytes(m, shape)))
    return mem


def microbatches(run: RunConfig) -> int:
    """Micro-batches per step per DP rank: global sequences / (micro-batch x dp)."""
    return run.train.global_batch_seqs_resolved // (run.train.micro_batch_size * run.layout.dp)


def lower(run: RunConfig, cost: ComputeCostModel) -> Lowered:
    """Lower a validated run into one program per pipeline stage, with sends matched to receives."""
    lay = run.layout
    m = microbatches(run)
    shape = activation_shape(run.train, lay, run.model)
    block = BlockBuilder(run.model, cost, shape.b, shape.s, lay.tp, lay.sequence_parallel, shape.flash,
                         shape.dropout, lay.cp, lay.cp_comm)
    plan = _layer_plan(run, block)
    layers = split_layers(run.model.n_layers, lay.pp, lay.vpp)
    schedule = build_schedule(lay.resolved_schedule, lay.pp, m, lay.vpp)
    lowered = Lowered(programs=[], schedule=schedule, chunk_memory=[], layers=layers, microbatches=m)
    stages = []
    for s in range(lay.pp):
        sl = _StageLowering(run, s, layers[s], plan, block, cost, lay.pp * lay.vpp)
        _param_gathers_at_start(sl)
        last_b = {c: max(a.microbatch for a in schedule[s] if a.chunk == c) for c in range(lay.vpp)}
        for a in schedule[s]:
            is_last = a.microbatch == last_b[a.chunk]
            (sl.forward if a.kind == "F" else sl.backward)(a, is_last)
        _finish_stage(sl)
        stages.append(sl)
        lowered.chunk_memory.append({c: _chunk_memory(sl, c) for c in range(len(layers[s]))})
        lowered.stage_params.append(sum(sl.chunk_params(c) for c in range(len(layers[s]))))
    _match_sends(stages)
    lowered.programs = [sl.prog for sl in stages]
    return lowered


def _match_sends(stages: list[_StageLowering]) -> None:
    """Point each receiving op at the send that feeds it: (kind, mb, dst virtual stage)."""
    index = {key: (sl.stage, idx) for sl in stages for key, idx in sl.sends.items()}
    for sl in stages:
        for op_idx, key in sl.em.recv_ops.items():
            sl.prog.ops[op_idx].remote = index[key]
