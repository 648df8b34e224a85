"""Lowering: (model, layout, train, grid) -> one op program per pipeline stage.

``lower`` is a dispatcher over small helpers: the schedule gives each stage its ordered actions;
each forward/backward action emits the embedding/layers/head segments of ``blocks``; pipeline sends
follow each action; data-parallel gradient reduction is bucketed and overlapped with backward
(Megatron-LM DDP / PyTorch DDP buckets), ZeRO-1/2 reduce-scatter gradients and all-gather
parameters, ZeRO-3/FSDP all-gather each layer's parameters before its forward and backward (with
prefetch) and reduce-scatter its gradients; the optimizer step closes the program. Ranks of one
stage differ only by their dp/tp coordinates, so one program serves them all (symmetric) and full
mode runs it on every rank.

The program is hardware-neutral (``lower_program``): compute ops hold kernel descriptors
(``simtrain.kernels``), host copies their bytes, and no op a time; ``lower`` runs the cost pass
(``simtrain.cost_pass``) over it with one cost source.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from simtrain.blocks import (
    TP_OVERLAP_CHUNKS,
    BlockBuilder,
    Comm,
    Ring,
    Segment,
    leading_gemms,
)
from simtrain.collective_kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SEND, Collective, CollectiveKind
from simtrain.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.cost_pass import cost_program
from simtrain.costs import ComputeCostModel
from simtrain.kernels import KernelDesc, MemoryBound, sliced
from simtrain.memory import (
    ActivationShape,
    ChunkMemory,
    activation_shape,
    backward_transient_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_checkpoint_bytes,
    loss_backward_transient_bytes,
    mlp_intermediate_bytes,
    op_sac_activation_bytes,
    pipeline_stage_buffer_bytes,
    torch_cp_backward_transient_bytes,
    weight_grad_input_bytes,
)
from simtrain.model import ModelSpec
from simtrain.offload import sync_layers
from simtrain.ops import Op, OpKind, Program, Stream
from simtrain.schedules import Action, Route, RouteShape, split_backward_keys
from simtrain.stack_rules import (
    dp_overlaps,
    fp8_amax_casts,
    fp32_grad_accumulation_kernel,
    fsdp1_grad_bytes,
    fsdp2_accumulates_fp32,
    fsdp_keeps_unsharded,
    grad_reduce_collective,
    optimizer_bytes_per_param,
    tp_overlap_on,
)
from simtrain.stacks import SoftwareStack

MiB = 1024.0**2
STREAM_OF_AXIS = {"tp": Stream.TP, "cp": Stream.CP, "ep": Stream.EP, "etp": Stream.TP}


def layers_by_position(n_layers: int, positions: int) -> list[int]:
    """Layers of each model stage (position on the pipeline path). Even when divisible; otherwise the
    first and last positions give up layers first, since they also hold the embedding and the LM head
    (Llama 3 405B removes one layer from each of them; Dubey et al. 2024 sec. 3.3.2; Megatron
    ``--decoder-first/last-pipeline-num-layers``)."""
    if n_layers % positions == 0:
        return [n_layers // positions] * positions
    base = -(-n_layers // positions)
    counts = [base] * positions
    deficit = positions * base - n_layers
    order = [i for pair in zip(range(positions), reversed(range(positions)), strict=True) for i in pair]
    for i in order[:deficit] if deficit <= positions else order:
        counts[i] -= 1
    return counts


def split_layers(n_layers: int, pp: int, vpp: int, route: Route | None = None) -> list[list[int]]:
    """Layers per (stage, chunk): the positions of ``route`` (default: Megatron's virtual stages,
    position = chunk * pp + stage) each get ``layers_by_position``'s share."""
    route = route or Route(RouteShape.INTERLEAVED, pp, vpp)
    counts = layers_by_position(n_layers, route.length)
    chunks = route.v  # chunks per stage: vpp, or 2 for DualPipe's and DualPipeV's routes
    return [[counts[route.position(0, s, c)] for c in range(chunks)] for s in range(pp)]


@dataclass(slots=True)
class LayerPlan:
    """Per-layer costs and memory deltas shared by every layer of the model."""

    fwd: list[Segment]
    bwd: list[Segment]
    act_bytes: float
    ckpt_bytes: float
    transient_bytes: float
    params_per_rank: float
    selective: list[Segment] = field(default_factory=list)
    """What selective recompute re-runs before the layer's backward (kernels, and under op-level SAC
    with TP the collectives its save list leaves out)."""
    expert_params_per_rank: float = 0.0
    """Routed-expert parameters of the layer on this rank (sharded by ep x etp, reduced over edp)."""
    bwd_input: list[Segment] = field(default_factory=list)
    """Backward without the weight-gradient GEMMs (zero-bubble "B", Qi et al. 2023 sec. 2)."""
    bwd_weight: tuple[KernelDesc, ...] = ()
    """The weight-gradient GEMMs alone (zero-bubble "W")."""
    weight_bytes: float = 0.0
    """Activations a split backward keeps from B until W: the linear layers' inputs."""
    recompute_bytes: float = 0.0
    """Activations ``selective`` rebuilds before the layer's backward (op-level SAC: what it did
    not save), allocated when they run and freed with the layer's backward."""


@dataclass(slots=True)
class Lowered:
    """Everything lowering produces: programs, schedule, and memory facts for the closed form."""

    programs: list[Program]
    schedule: list[list[Action]]
    chunk_memory: list[dict[int, ChunkMemory]]
    layers: list[list[int]]
    microbatches: int
    stage_params: list[float] = field(default_factory=list)
    stage_expert_params: list[float] = field(default_factory=list)
    stage_layer_params: list[float] = field(default_factory=list)
    """Transformer-layer parameters per stage on one rank (the linear layers FP8 keeps copies of)."""
    max_layer_params: float = 0.0
    """Largest per-rank layer (dense part), for ZeRO-3/FSDP gather buffers."""
    stage_pp_buffers: list[float] = field(default_factory=list)
    """Bytes each stage's pipeline runtime keeps for the whole step (``memory.pipeline_stage_buffer_bytes``)."""


class _Emitter:
    """Appends ops to one program, tracking the data dependency between streams."""

    def __init__(self, prog: Program, tp_overlap: bool):
        self.prog = prog
        self.tp_overlap = tp_overlap
        self.last_compute: int | None = None
        self.pending_comm: Op | None = None
        self.pending_comm_spec: Comm | None = None
        """A TP collective whose chunks the next compute segment pipelines with (TP comm overlap)."""
        self.recv_key: tuple[str, int, int] | None = None
        self.recv_ops: dict[int, tuple[str, int, int]] = {}
        self.extra_deps: list[int] = []
        self.overlap_comm: Op | None = None
        self.overlap_skip = 0
        self.overlap_older: list[int] = []
        """Earlier overlapped collectives the compute segment after the next must also wait for."""
        self.trailing: list[Op] = []
        self._names: dict[tuple[int, str], tuple[tuple[KernelDesc, ...], str]] = {}

    def comm(self, c: Comm, category: str, mb: int, chunk: int) -> None:
        """A collective after the last compute op; the next compute op waits for it."""
        if c.fused_with_gemm(self.tp_overlap):
            self.pending_comm_spec = c
            return
        self._blocking_comm(c, category, mb, chunk)

    def _blocking_comm(self, c: Comm, category: str, mb: int, chunk: int) -> None:
        deps = [] if self.last_compute is None else [self.last_compute]
        if self.pending_comm is not None:  # two collectives in a row: the second follows the first
            deps.append(self.pending_comm.idx)
        op = self.prog.add(OpKind.COLLECTIVE, STREAM_OF_AXIS[c.axis], f"{c.axis}.{c.coll}", category="comm",
                           deps=tuple(deps), coll=c.coll, axis=c.axis, comm_bytes=c.size_bytes, microbatch=mb,
                           chunk=chunk)
        if c.overlap:  # the next compute segment runs beside it; the one after waits for it
            if self.overlap_comm is not None:  # an earlier one still unwaited: that compute waits for it too
                (self.extra_deps if self.overlap_skip == 0 else self.overlap_older).append(self.overlap_comm.idx)
            self.pending_comm, self.overlap_comm, self.overlap_skip = None, op, 1
        else:
            self.pending_comm = op

    def ring(self, r: Ring, category: str, mb: int, chunk: int) -> None:
        """Ring attention: compute block i while KV block i moves on; block i+1 waits for that move."""
        prev_comm = self.pending_comm
        for i in range(r.steps):
            recv = prev_comm
            if i < r.steps - 1 and r.comm is not None:
                deps = [d.idx for d in (prev_comm,) if d is not None] or (
                    [] if self.last_compute is None else [self.last_compute])
                prev_comm = self.prog.add(OpKind.COLLECTIVE, STREAM_OF_AXIS[r.comm.axis],
                                          f"{r.comm.axis}.{r.comm.coll}", category="comm", deps=tuple(deps),
                                          coll=r.comm.coll, axis=r.comm.axis, comm_bytes=r.comm.size_bytes,
                                          microbatch=mb, chunk=chunk)
            self.pending_comm = recv
            self.compute(r.kernels, category, mb, chunk)
        self.pending_comm = None

    def compute(self, kernels: tuple[KernelDesc, ...], category: str, mb: int, chunk: int,
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
        if self.overlap_comm is not None:
            if self.overlap_skip:
                self.overlap_skip -= 1
            else:
                deps += [*self.overlap_older, self.overlap_comm.idx]
                self.overlap_comm, self.overlap_older = None, []
        self.extra_deps = []
        op = self.prog.add(OpKind.COMPUTE, Stream.COMPUTE, self._name(kernels, category), category=category,
                           deps=tuple(deps), kernels=kernels, microbatch=mb, chunk=chunk,
                           mem_start=((tag, mem_start),) if mem_start else (),
                           mem_end=((tag, mem_end),) if mem_end else ())
        if self.recv_key is not None:
            self.recv_ops[op.idx] = self.recv_key
            self.recv_key = None
        self.last_compute = op.idx
        return op

    def _name(self, kernels: tuple[KernelDesc, ...], category: str) -> str:
        """The op name of a compute op's kernels; memoised per kernel tuple (a layer plan's segments are
        emitted once per micro-batch and layer)."""
        key = (id(kernels), category)
        hit = self._names.get(key)
        if hit is None or hit[0] is not kernels:
            name = kernels[0].name if len(kernels) == 1 else f"{category}:{kernels[0].name}..{kernels[-1].name}"
            hit = self._names[key] = (kernels, name)
        return hit[1]

    def _overlapped(self, kernels: tuple[KernelDesc, ...], category: str, mb: int, chunk: int,
                    mem_start: float, mem_end: float, tag: str, after: Comm | None = None) -> Op | None:
        """TP communication overlap (Megatron ``--tp-comm-overlap``, Transformer Engine userbuffers;
        torch async TP): a collective pipelines only with the GEMMs it is fused with. A preceding
        all-gather feeds the segment's leading GEMMs (TE ``LayerNormLinear`` QKV / FC1 with
        ``ub_overlap_ag``; torch ``fused_all_gather_matmul``; in backward the dgrad GEMM that reads the
        gathered output gradient, ``leading_gemms(gathered=True)``), a following reduce-scatter is fed
        by its trailing GEMMs (``ub_overlap_rs``; ``fused_matmul_reduce_scatter``). Kernels between them (RoPE, core attention, the activation)
        run on their own: a collective next to one of those waits for it or is waited for."""
        before = self.pending_comm_spec
        self.pending_comm_spec = None
        lead = leading_gemms(kernels, gathered=True) if before is not None else 0
        trail = leading_gemms(kernels[::-1]) if after is not None else 0
        if lead == len(kernels) or trail == len(kernels):
            return self._pipelined(kernels, before, after, category, mb, chunk, mem_start, mem_end, tag)
        head, mid, tail = kernels[:lead], kernels[lead:len(kernels) - trail], kernels[len(kernels) - trail:]
        op = None
        if before is not None and not head:
            self._blocking_comm(before, category, mb, chunk)
        if head:
            op = self._pipelined(head, before, None, category, mb, chunk, mem_start, 0.0, tag)
            mem_start = 0.0
        op = self.compute(mid, category, mb, chunk, mem_start, 0.0 if tail else mem_end, tag) or op
        if tail:
            op = self._pipelined(tail, None, after, category, mb, chunk, 0.0, mem_end, tag)
        elif after is not None:
            self._blocking_comm(after, category, mb, chunk)
        return op

    def _pipelined(self, kernels: tuple[KernelDesc, ...], before: Comm | None, after: Comm | None, category: str,
                   mb: int, chunk: int, mem_start: float, mem_end: float, tag: str) -> Op | None:
        """The kernels split in ``TP_OVERLAP_CHUNKS``: chunk i of ``before`` (an all-gather) feeds compute
        chunk i, and compute chunk i feeds chunk i of ``after`` (a reduce-scatter). Each compute chunk
        runs a 1/n slice of every kernel (``kernels.Sliced``: the cost pass gives it 1/n of the time)."""
        n = TP_OVERLAP_CHUNKS
        part = tuple(sliced(k, n) for k in kernels)
        producer = () if self.last_compute is None else (self.last_compute,)
        # the all-gather chunks are issued first: the TP stream runs in order, so a reduce-scatter
        # chunk waiting for its GEMM chunk must not hold back the next all-gather chunk
        gathers = [] if before is None else [
            self.prog.add(OpKind.COLLECTIVE, Stream.TP, f"tp.{before.coll}", category="comm", deps=producer,
                          coll=before.coll, axis="tp", comm_bytes=before.size_bytes / n, microbatch=mb, chunk=chunk)
            for _ in range(n)]
        op = None
        for i in range(n):
            if gathers:
                self.pending_comm = gathers[i]
            op = self.compute(part, category, mb, chunk, mem_start if i == 0 else 0.0,
                              mem_end if i == n - 1 else 0.0, tag)
            if after is not None and op is not None:
                self.trailing.append(self.prog.add(
                    OpKind.COLLECTIVE, Stream.TP, f"tp.{after.coll}", category="comm", deps=(op.idx,),
                    coll=after.coll, axis="tp", comm_bytes=after.size_bytes / n, microbatch=mb, chunk=chunk))
        if after is not None and self.trailing:
            self.pending_comm = self.trailing[-1]  # the next compute waits for the last chunk
            self.trailing = []
        return op

    def segments(self, segs: list[Segment], category: str, mb: int, chunk: int,
                 mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> None:
        """Emit a segment list; ``mem_start`` goes on its first compute op, ``mem_end`` on its last."""
        for _ in self.segment_steps(segs, category, mb, chunk, mem_start, mem_end, tag):
            pass

    def segment_steps(self, segs: list[Segment], category: str, mb: int, chunk: int,
                      mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> Iterator[None]:
        """``segments``, pausing after each compute segment (to interleave two chains, as DualPipe)."""
        computes = [i for i, s in enumerate(segs) if isinstance(s, tuple) and s]
        done = -1
        for i, s in enumerate(segs):
            if i == done:
                continue
            if _fused_with_next(segs, i, self.tp_overlap):
                nxt = segs[i + 1]
                assert isinstance(s, tuple) and isinstance(nxt, Comm)
                # a reduce-scatter/all-reduce of this segment's output pipelines with it
                self._overlapped(s, category, mb, chunk, mem_start if i == computes[0] else 0.0,
                                 mem_end if i == computes[-1] else 0.0, tag, after=nxt)
                done = i + 1
                yield
                continue
            if isinstance(s, Comm):
                self.comm(s, category, mb, chunk)
            elif isinstance(s, Ring):
                self.ring(s, category, mb, chunk)
                yield
            elif s:
                self.compute(s, category, mb, chunk, mem_start if i == computes[0] else 0.0,
                             mem_end if i == computes[-1] else 0.0, tag)
                yield


def _fused_with_next(segs: list[Segment], i: int, tp_overlap: bool) -> bool:
    """Whether compute segment i pipelines with the reduce-scatter/all-reduce of its output after it."""
    s, nxt = segs[i], segs[i + 1] if i + 1 < len(segs) else None
    return bool(isinstance(s, tuple) and s and isinstance(nxt, Comm) and nxt.fused_with_gemm(tp_overlap)
                and nxt.coll.kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE))


def segment_marks(segs: list[Segment], tp_overlap: bool) -> list[tuple[bool, bool]]:
    """One (carries ``mem_start``, carries ``mem_end``) per step ``_Emitter.segment_steps`` pauses after
    for ``segs``: the granularity at which DualPipe's overlapped pair interleaves its two chains
    (``_StageLowering.run_pair``), so the closed-form peak (``memory.closed_form_peak``) interleaves
    their memory deltas exactly as the ledger sees them."""
    computes = [i for i, s in enumerate(segs) if isinstance(s, tuple) and s]
    if not computes:
        return []
    first, last = computes[0], computes[-1]
    out: list[tuple[bool, bool]] = []
    done = -1
    for i, s in enumerate(segs):
        if i == done:
            continue
        if _fused_with_next(segs, i, tp_overlap):
            out.append((i == first, i == last))
            done = i + 1
        elif isinstance(s, Ring):
            out.append((False, False))
        elif isinstance(s, tuple) and s:
            out.append((i == first, i == last))
    return out


def per_step(segs: list[Segment], tp_overlap: bool | None, start: float, end: float) -> list[tuple[float, float]]:
    """The (start, end) deltas of ``segs`` emitted with ``mem_start=start, mem_end=end``: one entry per
    step of ``segment_marks`` (zeros where a step carries neither), or one entry when ``tp_overlap`` is
    None (a sequential walk needs no steps)."""
    marks = segment_marks(segs, tp_overlap) if tp_overlap is not None else []
    if not marks:
        return [(start, end)]
    return [(start if a else 0.0, end if b else 0.0) for a, b in marks]


@dataclass(frozen=True, slots=True)
class EdgeSegments:
    """The embedding's and the head's segments and the TP-overlap flag: what ``chunk_memory`` needs to
    give its deltas one entry per emission step (``segment_marks``)."""

    tp_overlap: bool
    embedding_fwd: list[Segment]
    embedding_bwd: list[Segment]
    head_fwd: list[Segment]
    head_bwd: list[Segment]


def edge_segments(block: BlockBuilder, layout: LayoutConfig) -> EdgeSegments:
    """``EdgeSegments`` of a block builder."""
    return EdgeSegments(tp_overlap_on(layout), block.embedding_forward(), block.embedding_backward(),
                        block.head_forward(), block.head_backward())


@dataclass(slots=True)
class _StageLowering:
    """Builds the program of one pipeline stage."""

    run: RunConfig
    stage: int
    layers: list[int]
    plans: dict[int, LayerPlan]
    """Plan of every global layer index (layers with the same structure share one plan)."""
    first_layer: list[int]
    """Global index of the first layer of each chunk on this stage."""
    block: BlockBuilder
    route: Route
    split: set[tuple[int, int]] = field(default_factory=set)
    """(micro-batch, chunk) whose backward is split into B (input grads) and W (weight grads)."""
    prog: Program = field(init=False)
    em: _Emitter = field(init=False)
    sends: dict[tuple[str, int, int], int] = field(default_factory=dict)
    dp_ops: list[int] = field(default_factory=list)
    deferred: list[tuple[Collective, float, str]] = field(default_factory=list)
    param_gathers: dict[int, list[int]] = field(default_factory=dict)
    fsdp_gathers: dict[tuple[str, int, int, int], list[int]] = field(default_factory=dict)
    fsdp_copied: set[tuple[str, int, int, int]] = field(default_factory=set)
    """Gathers whose FSDP2 copy-out has been emitted (``SoftwareStack.fsdp_param_copies``)."""
    stack: SoftwareStack = field(init=False)
    keep_unsharded: bool = field(init=False)
    """ZeRO-3 under PP keeping the stage's parameters gathered for the step (``fsdp_keeps_unsharded``)."""

    @property
    def n_virtual(self) -> int:
        """Positions on the pipeline path (model stages)."""
        return self.route.length

    def __post_init__(self) -> None:
        self.prog = Program(self.stage)
        self.em = _Emitter(self.prog, tp_overlap_on(self.run.layout))
        self.stack = self.run.train.stack_spec
        self.keep_unsharded = fsdp_keeps_unsharded(self.run.layout, self.stack)

    # -- helpers -------------------------------------------------------------------------------
    @property
    def pp(self) -> int:
        return self.run.layout.pp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: ranks of a stage holding the same experts (1 without MoE)."""
        lay = self.run.layout
        if not self.run.model.is_moe:
            return 1
        return lay.expert_data_degree

    def vstage(self, chunk: int) -> int:
        """Position of ``chunk`` of this stage on the pipeline path (Megatron's virtual stage
        chunk * pp + stage; DualPipe: stage s for chunk 0, p - 1 - s for chunk 1)."""
        return self.route.position(0, self.stage, chunk)

    def _recompute_layer(self, i: int) -> bool:
        return i < recomputed_layers(self.run.layout, i + 1)

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
        mtp = sum(p.params_per_rank for p in self._mtp())
        mtp += m.mtp_depth * (2 * m.hidden * m.hidden / self.run.layout.tp + 3 * m.hidden)  # projection + norms
        return head / self.run.layout.tp + m.final_norm_params() + mtp

    def _extra_params(self, chunk: int) -> float:
        return self._embed_params(chunk) + self._head_params(chunk)

    def chunk_params(self, chunk: int) -> float:
        """Parameters of one chunk on this rank."""
        return sum(self.plan(chunk, i).params_per_rank for i in range(self.layers[chunk])) + self._extra_params(chunk)

    def chunk_expert_params(self, chunk: int) -> float:
        """Routed-expert parameters of one chunk on this rank (MTP blocks' on the last position)."""
        mtp = sum(p.expert_params_per_rank for p in self._mtp()) if self.vstage(chunk) == self.n_virtual - 1 else 0.0
        return sum(self.plan(chunk, i).expert_params_per_rank for i in range(self.layers[chunk])) + mtp

    def plan(self, chunk: int, i: int) -> LayerPlan:
        """Plan of the i-th layer of ``chunk`` on this stage."""
        return self.plans[self.first_layer[chunk] + i]

    # -- forward / backward --------------------------------------------------------------------
    def forward(self, a: Action, is_last_mb: bool) -> Iterator[None]:
        """Emit a forward action, pausing after each compute segment (reads ``self.em`` afresh, so a
        caller may switch emitters between steps)."""
        v = self.vstage(a.chunk)
        if v > 0:
            self.em.recv_key = ("F", a.microbatch, v)
        if self.gathers_before(a.chunk, a.microbatch):
            self.em.extra_deps = list(self.param_gathers.get(a.chunk, []))
        if v == 0:
            yield from self.em.segment_steps(self.block.embedding_forward(), "fwd", a.microbatch, a.chunk,
                                             mem_start=embedding_activation_bytes(self.run.model, self._shape))
        order = list(range(self.layers[a.chunk]))
        offload = _Offload(self, a) if self.run.layout.offload_activation_layers else None
        for i in order:
            plan = self.plan(a.chunk, i)
            self._fsdp_gather("F", a, order, i)
            end = -(plan.act_bytes - plan.ckpt_bytes) if self._recompute_layer(i) else 0.0
            yield from self.em.segment_steps(plan.fwd, "fwd", a.microbatch, a.chunk, mem_start=plan.act_bytes,
                                             mem_end=end)
            if offload is not None:
                offload.after_forward(i)
        if v == self.n_virtual - 1:
            yield from self.em.segment_steps(self.block.head_forward(), "fwd", a.microbatch, a.chunk,
                                             mem_start=head_activation_bytes(self.run.model, self._shape))
            yield from self._mtp_forward(a)
        else:
            self._send("F", a, v + 1)

    def _mtp(self) -> list[LayerPlan]:
        """Plans of the multi-token-prediction modules (DeepSeek-V3 sec. 2.2), last position only."""
        m = self.run.model
        return [self.plans[m.n_layers + k] for k in range(m.mtp_depth)]

    def _mtp_forward(self, a: Action) -> Iterator[None]:
        """Each MTP module: projection of [norm(h), norm(emb)] (2h -> h), one transformer block and
        the shared output head; its activations live until its backward."""
        head = head_activation_bytes(self.run.model, self._shape)
        for plan in self._mtp():
            self.em.compute((self.block.mtp_projection(False)[0],), "fwd", a.microbatch, a.chunk)
            yield from self.em.segment_steps(plan.fwd, "fwd", a.microbatch, a.chunk, mem_start=plan.act_bytes)
            yield from self.em.segment_steps(self.block.head_forward(), "fwd", a.microbatch, a.chunk,
                                             mem_start=head)

    def _mtp_backward(self, a: Action, bucket: BucketFiller) -> Iterator[None]:
        head = head_activation_bytes(self.run.model, self._shape)
        for plan in reversed(self._mtp()):
            yield from self.em.segment_steps(self.block.head_backward(), "bwd", a.microbatch, a.chunk, mem_end=-head)
            yield from self.em.segment_steps(plan.bwd, "bwd", a.microbatch, a.chunk, mem_start=plan.transient_bytes,
                                             mem_end=-(plan.act_bytes + plan.transient_bytes))
            self.em.compute(self.block.mtp_projection(True), "bwd", a.microbatch, a.chunk)
            bucket.add(plan.params_per_rank, plan.expert_params_per_rank)

    def backward(self, a: Action, is_last_mb: bool) -> Iterator[None]:
        """Emit a backward: the full one, or with a split the input-gradient part (zero-bubble "B")."""
        v = self.vstage(a.chunk)
        m = self.run.model
        split = (a.microbatch, a.chunk) in self.split
        if v < self.n_virtual - 1:
            self.em.recv_key = ("B", a.microbatch, v)
        bucket = BucketFiller(self, a, is_last_mb)
        if v == self.n_virtual - 1:
            yield from self._mtp_backward(a, bucket)
            loss = self._loss_transient
            yield from self.em.segment_steps(self.block.head_backward(), "bwd", a.microbatch, a.chunk,
                                             mem_start=loss, mem_end=-(head_activation_bytes(m, self._shape) + loss))
        if not split:
            bucket.add(self._head_params(a.chunk))
        order = list(reversed(range(self.layers[a.chunk])))
        offload = _Offload(self, a) if self.run.layout.offload_activation_layers else None
        for pos, i in enumerate(order):
            plan = self.plan(a.chunk, i)
            self._fsdp_gather("B", a, order, pos)
            if offload is not None:
                offload.before_backward(i)
            rec = self._recompute_layer(i)
            keep = plan.ckpt_bytes if rec else plan.act_bytes
            if rec:
                yield from self.em.segment_steps(plan.fwd, "recompute", a.microbatch, a.chunk,
                                                 mem_start=plan.act_bytes)
            elif plan.selective and self.run.layout.recompute in ("selective", "op_sac"):
                yield from self.em.segment_steps(plan.selective, "recompute", a.microbatch, a.chunk,
                                                 mem_start=plan.recompute_bytes)
            freed = keep + (plan.act_bytes if rec else plan.recompute_bytes) + plan.transient_bytes
            if split:
                yield from self.em.segment_steps(plan.bwd_input, "bwd", a.microbatch, a.chunk,
                                                 mem_start=plan.transient_bytes, mem_end=-(freed - plan.weight_bytes))
                continue
            yield from self.em.segment_steps(plan.bwd, "bwd", a.microbatch, a.chunk, mem_start=plan.transient_bytes,
                                             mem_end=-freed)
            self._fsdp_reduce(a, i, is_last_mb)
            bucket.add(plan.params_per_rank, plan.expert_params_per_rank)
        if v == 0 and not split:
            yield from self.em.segment_steps(self.block.embedding_backward(), "bwd", a.microbatch, a.chunk,
                                             mem_end=-embedding_activation_bytes(m, self._shape))
            bucket.add(self._embed_params(a.chunk))
        bucket.flush()
        if not split:
            self._fp32_grad_accumulation(a)
            self._fsdp_reduce_chunk(a, is_last_mb)
        if v > 0:
            self._send("B", a, v - 1)

    def _fp32_grad_accumulation(self, a: Action) -> None:
        """The pass adding this micro-batch's BF16 gradients of the chunk into their FP32 copies, where the
        stack runs one (``fp32_grad_accumulation_kernel``), before the chunk's gradients are reduced."""
        params = self.chunk_params(a.chunk) + self.chunk_expert_params(a.chunk)
        kernel = fp32_grad_accumulation_kernel(self.run.layout, self.run.train, self.stack, params)
        if kernel is not None:
            self.em.compute((kernel,), "bwd", a.microbatch, a.chunk)

    def weight_grad(self, a: Action, is_last_mb: bool) -> Iterator[None]:
        """Zero-bubble "W": the weight-gradient GEMMs of a split backward, then the gradient buckets."""
        v = self.vstage(a.chunk)
        m = self.run.model
        bucket = BucketFiller(self, a, is_last_mb)
        bucket.add(self._head_params(a.chunk))
        for i in reversed(range(self.layers[a.chunk])):
            plan = self.plan(a.chunk, i)
            self.em.compute(plan.bwd_weight, "bwd", a.microbatch, a.chunk, mem_end=-plan.weight_bytes)
            yield
            self._fsdp_reduce(a, i, is_last_mb)
            bucket.add(plan.params_per_rank, plan.expert_params_per_rank)
        if v == 0:
            yield from self.em.segment_steps(self.block.embedding_backward(), "bwd", a.microbatch, a.chunk,
                                             mem_end=-embedding_activation_bytes(m, self._shape))
            bucket.add(self._embed_params(a.chunk))
        bucket.flush()
        self._fsdp_reduce_chunk(a, is_last_mb)

    def steps(self, a: Action, is_last_mb: bool) -> Iterator[None]:
        """The emission steps of one action."""
        if a.kind == "F":
            return self.forward(a, is_last_mb)
        if a.kind == "W":
            return self.weight_grad(a, is_last_mb)
        return self.backward(a, is_last_mb)

    def run_pair(self, first: Iterator[None], second: Iterator[None]) -> None:
        """DualPipe's overlapped F&B pair: two chains of ops, each with its own emitter (data
        dependencies), interleaved one compute segment at a time on the in-order compute stream, so
        one chain's all-to-alls and sends run while the other computes (DeepSeek-V3 sec. 3.2.1)."""
        main, other = self.em, _Emitter(self.prog, self.em.tp_overlap)
        other.last_compute = main.last_compute
        chains = [(main, first), (other, second)]
        while chains:
            for chain in list(chains):
                self.em = chain[0]
                if next(chain[1], StopIteration) is StopIteration:
                    chains.remove(chain)
        main.recv_ops.update(other.recv_ops)
        main.last_compute = max(x for x in (main.last_compute, other.last_compute, -1) if x is not None)
        self.em = main

    @property
    def _shape(self):  # type: ignore[no-untyped-def]
        return activation_shape(self.run.train, self.run.layout, self.run.model)

    @property
    def _loss_transient(self) -> float:
        """Bytes the loss's backward holds beyond the head's activations (eager fp32 cross-entropy)."""
        return loss_backward_transient_bytes(self.run.model, self._shape, self.stack.eager_loss,
                                             loss_parallel=self.stack.dtensor_tp)

    def _send(self, kind: str, a: Action, dst_v: int) -> None:
        """Pipeline send of this action's output (activations or input gradients) to ``dst_v``."""
        lay = self.run.layout
        size = 2.0 * self.block.T * self.run.model.hidden / lay.tp
        deps = () if self.em.last_compute is None else (self.em.last_compute,)
        op = self.prog.add(OpKind.SEND, Stream.PP, f"pp.send.{kind}", category="comm", deps=deps, coll=SEND,
                           axis="pp", comm_bytes=size, peer_stage=self.route.at(a.microbatch, dst_v)[0],
                           microbatch=a.microbatch, chunk=a.chunk)
        self.sends[(kind, a.microbatch, dst_v)] = op.idx

    # -- data parallelism ----------------------------------------------------------------------
    def gathers_before(self, chunk: int, mb: int) -> bool:
        return mb == 0 and chunk in self.param_gathers

    def dp_collective(self, coll: Collective, axis: str, size: float, name: str, deps: tuple[int, ...]) -> Op:
        op = self.prog.add(OpKind.COLLECTIVE, Stream.DP, name, category="comm", deps=deps, coll=coll,
                           axis=axis, comm_bytes=size)
        self.dp_ops.append(op.idx)
        return op

    def _fsdp_gather(self, kind: str, a: Action, order: list[int], pos: int) -> None:
        """ZeRO-3/FSDP: the parameter all-gathers of the layer at ``order[pos]`` and its prefetch.

        As FSDP2 (``fully_shard``; forward prefetch of the next block, backward prefetch of the
        previous one; DeepSpeed ZeRO-3 prefetches the same way) does: when the layer at position
        ``pos`` starts, the all-gathers of the layers at ``pos .. pos + fsdp_prefetch_layers`` of
        this action's layer order (forward: ascending; backward: descending) are issued, each once,
        on the all-gather stream (``Stream.DP_GATHER``), which runs beside the reduce-scatters of the
        DP stream; the layer's first kernel waits for its own all-gather. The gathered layers held at
        once (the running one and the prefetched ones) are ``memory.static_memory``'s ZeRO-3 buffers.
        """
        lay = self.run.layout
        if lay.shard_stage < 3 or (lay.data_degree == 1 and self.edp == 1):
            return
        axis = "dp_shard" if lay.fsdp == "hybrid" else lay.data_axis
        deps = () if self.em.last_compute is None else (self.em.last_compute,)
        keep = self.keep_unsharded  # one gather per layer and step, reused by every action
        for j in order[pos:pos + 1 + lay.fsdp_prefetch_layers]:
            key = ("F", -1, a.chunk, j) if keep else (kind, a.microbatch, a.chunk, j)
            if key not in self.fsdp_gathers:
                plan = self.plan(a.chunk, j)
                # dense weights over the data axis; routed experts over the expert-data-parallel group
                ids = []
                for params, ax, degree in ((plan.params_per_rank, axis, lay.data_degree),
                                           (plan.expert_params_per_rank, "edp", self.edp)):
                    if params > 0 and degree > 1:
                        ids.append(self.prog.add(OpKind.COLLECTIVE, Stream.DP_GATHER, f"fsdp.all_gather.{kind}",
                                                 category="comm", deps=deps, coll=ALL_GATHER, axis=ax,
                                                 comm_bytes=2.0 * params, microbatch=a.microbatch,
                                                 chunk=a.chunk).idx)
                self.fsdp_gathers[key] = ids
        own = ("F", -1, a.chunk, order[pos]) if keep else (kind, a.microbatch, a.chunk, order[pos])
        self.em.extra_deps = [*self.em.extra_deps, *self.fsdp_gathers[own]]
        if self.stack.fsdp_param_copies and self.fsdp_gathers[own] and own not in self.fsdp_copied:
            self.fsdp_copied.add(own)
            plan = self.plan(a.chunk, order[pos])
            # FSDP2 copy-out of the gathered flat buffer into the unsharded bf16 parameters (read + write)
            copy = MemoryBound("fsdp.copy_out", 4.0 * (plan.params_per_rank + plan.expert_params_per_rank))
            self.em.compute((copy,), "fwd" if kind == "F" else "bwd", a.microbatch, a.chunk)

    def _fsdp_reduce(self, a: Action, i: int, is_last_mb: bool) -> None:
        """ZeRO-3/FSDP: reduce-scatter the gradients of layer ``i`` right after its backward (unless
        the stage keeps its parameters unsharded: then ``_fsdp_reduce_chunk`` does it at the end)."""
        if self.run.layout.shard_stage < 3 or self.keep_unsharded:
            return
        self._fsdp_reduce_layer(a, i, is_last_mb)

    def _fsdp_reduce_chunk(self, a: Action, is_last_mb: bool) -> None:
        """A stage that kept its parameters unsharded reduce-scatters every layer's accumulated
        gradients once, after its last backward (``PipelineStage.backward_maybe_with_nosync``)."""
        if is_last_mb and self.keep_unsharded:
            for i in reversed(range(self.layers[a.chunk])):
                self._fsdp_reduce_layer(a, i, True)

    def _fsdp_grad_passes(self, a: Action, params: float) -> None:
        """The memory passes that build a layer's reduce-scatter input from its ``params`` gradients, on the
        compute stream: FSDP2's copy-in (``fsdp_param_copies``: into the flat input, cast to the reduce
        dtype; it runs on the reduce-scatter stream but takes SMs and HBM from the compute it overlaps; a
        kept stage's gradients are already the fp32 accumulators, read 4 B, not the bf16 2 B) or FSDP1's
        flat gradient (``fsdp_flat_grads``: the autograd cat, its cast and pre-divide; the last two run on
        the post-backward stream beside the backward)."""
        grad_b = self.run.train.grad_bytes
        if self.stack.fsdp_param_copies:
            src_b = grad_b if fsdp2_accumulates_fp32(self.run.layout, self.run.train, self.stack) else 2.0
            self.em.compute((MemoryBound("fsdp.copy_in", (src_b + grad_b) * params),), "bwd",
                            a.microbatch, a.chunk)
        if self.stack.fsdp_flat_grads:
            self.em.compute((MemoryBound("fsdp.flat_grad", fsdp1_grad_bytes(grad_b) * params),), "bwd",
                            a.microbatch, a.chunk)

    def _fsdp_reduce_layer(self, a: Action, i: int, is_last_mb: bool) -> None:
        lay = self.run.layout
        grad_b = self.run.train.grad_bytes
        plan = self.plan(a.chunk, i)
        if lay.data_degree > 1 or self.edp > 1:
            self._fsdp_grad_passes(a, plan.params_per_rank + plan.expert_params_per_rank)
        size = grad_b * plan.params_per_rank
        deps = (self.em.last_compute,) if self.em.last_compute is not None else ()
        experts = grad_b * plan.expert_params_per_rank
        if experts > 0 and self.edp > 1:  # routed-expert gradients over the expert-data-parallel group
            self.dp_collective(REDUCE_SCATTER, "edp", experts, "fsdp.reduce_scatter.experts", deps)
        if lay.data_degree == 1:
            return
        if lay.fsdp == "hybrid" and lay.fsdp_shard_size and lay.fsdp_shard_size < lay.dp:
            op = self.dp_collective(REDUCE_SCATTER, "dp_shard", size, "fsdp.reduce_scatter", deps)
            if is_last_mb:
                self.dp_collective(ALL_REDUCE, "dp_replicate", size / lay.fsdp_shard_size,
                                   "fsdp.all_reduce.replicas", (op.idx,))
        else:
            self.dp_collective(REDUCE_SCATTER, lay.data_axis, size, "fsdp.reduce_scatter", deps)


@dataclass(slots=True)
class BucketFiller:
    """Groups gradients into buckets in backward order and reduces each as it fills (DDP buckets).

    Dense gradients reduce over the data axis (dp, or dp x cp); routed-expert gradients over the
    expert-data-parallel group (Megatron-core keeps separate expert buckets)."""

    sl: _StageLowering
    action: Action
    is_last_mb: bool
    pending: float = 0.0
    pending_expert: float = 0.0

    @property
    def active(self) -> bool:
        lay = self.sl.run.layout
        if lay.data_degree == 1 and self.sl.edp == 1 or lay.shard_stage >= 3:
            return False
        return self.is_last_mb or lay.shard_stage == 2

    def add(self, params: float, expert_params: float = 0.0) -> None:
        if not self.active or params + expert_params <= 0:
            return
        self.pending += params
        self.pending_expert += expert_params
        if (self.pending + self.pending_expert) * self._grad_bytes >= self.sl.run.layout.grad_bucket_MiB * MiB:
            self.flush()

    @property
    def _grad_bytes(self) -> float:
        return self.sl.run.train.grad_bytes

    def flush(self) -> None:
        if not self.active:
            return
        lay = self.sl.run.layout
        coll = grad_reduce_collective(lay, self.sl.stack)
        last = self.sl.em.last_compute
        for params, axis, degree in ((self.pending, lay.data_axis, lay.data_degree),
                                     (self.pending_expert, "edp", self.sl.edp)):
            if params <= 0 or degree == 1:
                continue
            size = params * self._grad_bytes
            if lay.shard_stage == 0:
                # DDP's passes over the bucket (scale; PyTorch: copy in, divide, copy out), on the compute stream
                passes = self.sl.stack.ddp_grad_passes
                self.sl.em.compute((MemoryBound("ddp.bucket", 2.0 * passes * size),), "bwd",
                                   self.action.microbatch, self.action.chunk)
                last = self.sl.em.last_compute
            if dp_overlaps(lay, self.sl.stack)[0]:
                self.sl.dp_collective(coll, axis, size, f"dp.{coll}", () if last is None else (last,))
            else:
                self.sl.deferred.append((coll, size, axis))
        self.pending = self.pending_expert = 0.0


class _Offload:
    """CPU activation offloading of one action's layers (``simtrain.offload``): the copies on the
    offload/reload streams, and the compute stream's waits at Transformer Engine's sync points, which
    free the offloaded layer's GPU copy (forward) or allocate it again (backward)."""

    def __init__(self, sl: _StageLowering, a: Action):
        self.sl, self.a = sl, a
        self.n = sl.run.layout.offload_activation_layers
        self.sync = sync_layers(sl.layers[a.chunk], self.n)
        self.group = 0 if a.kind == "F" else self.n - 1
        """Forward: next group to sync; backward: next group to reload."""
        self.copy: Op | None = None
        """The copy in flight (the compute stream waits for it at the next sync point)."""

    def _bytes(self, k: int) -> float:
        return self.sl.plan(self.a.chunk, k).act_bytes

    def _copy(self, k: int, stream: Stream, deps: tuple[int, ...]) -> Op:
        name = "offload.d2h" if stream == Stream.OFFLOAD else "offload.h2d"
        # no time here: the cost pass gives it the host link's copy time (CostSource.host_copy_s)
        return self.sl.prog.add(OpKind.COPY, stream, name, category="comm", deps=deps, axis="offload",
                                comm_bytes=self._bytes(k),
                                microbatch=self.a.microbatch, chunk=self.a.chunk)

    def _wait(self, category: str, mem: float) -> None:
        """The compute stream waits for the copy in flight; ``mem`` bytes freed (-) or allocated (+)."""
        deps = (self.copy.idx,) if self.copy is not None else ()
        self.sl.prog.add(OpKind.COMPUTE, Stream.COMPUTE, "offload.wait", category=category, deps=deps,
                         microbatch=self.a.microbatch, chunk=self.a.chunk,
                         mem_start=(("activations", mem),) if mem else ())

    def _after_compute(self) -> tuple[int, ...]:
        """Deps of a copy the handler starts now: the last compute op. A copy started at a sync point
        follows the copy it waited for on the same stream, so it starts at the wait's end too."""
        last = self.sl.em.last_compute
        return () if last is None else (last,)

    def after_forward(self, i: int) -> None:
        """After layer i's forward: start layer 0's copy; at sync point k, wait for copy k, free it,
        start copy k + 1."""
        if i == 0:
            self.copy = self._copy(0, Stream.OFFLOAD, self._after_compute())
        k = self.group
        if k < self.n and self.sync[k] == i:
            self._wait("fwd", -self._bytes(k))
            self.copy = self._copy(k + 1, Stream.OFFLOAD, self._after_compute()) if k + 1 < self.n else None
            self.group += 1

    def before_backward(self, i: int) -> None:
        """Before layer i's backward: at sync point k, wait for reload k + 1, allocate layer k again and
        start its reload; before layer 0, wait for the last reload."""
        k = self.group
        if k >= 0 and self.sync[k] == i:
            self._wait("bwd", self._bytes(k))
            self.copy = self._copy(k, Stream.RELOAD, self._after_compute())
            self.group -= 1
        if i == 0 and self.copy is not None:
            self._wait("bwd", 0.0)
            self.copy = None


def _finish_stage(sl: _StageLowering) -> None:
    """Deferred gradient reductions, the optimizer step and (ZeRO-1/2) the parameter all-gather."""
    lay, train = sl.run.layout, sl.run.train
    last = sl.em.last_compute
    for coll, size, axis in sl.deferred:
        sl.dp_collective(coll, axis, size, f"dp.{coll}", () if last is None else (last,))
    emb = embedding_sync_bytes(sl.run.model, lay, train, {sl.vstage(c) for c in range(len(sl.layers))}, sl.n_virtual,
                               sl.stack)
    if emb > 0:
        sl.dp_collective(ALL_REDUCE, "pp_emb", emb, "pp.embedding_grad_all_reduce", () if last is None else (last,))
    chunks = range(len(sl.layers))
    params = sum(sl.chunk_params(c) for c in chunks)
    experts = sum(sl.chunk_expert_params(c) for c in chunks)
    shard = lay.data_degree if lay.shard_stage >= 1 else 1
    if lay.fsdp == "hybrid" and lay.fsdp_shard_size:
        shard = lay.fsdp_shard_size
    expert_shard = sl.edp if lay.shard_stage >= 1 else 1
    per_param = optimizer_bytes_per_param(train, sl.stack)
    kernel = MemoryBound("optimizer.step", per_param * (params / shard + experts / expert_shard))
    deps = (sl.dp_ops[-1],) if sl.dp_ops else ()
    sl.em.pending_comm = None
    sl.em.extra_deps = list(deps)
    opt = sl.em.compute((kernel,), "optimizer", -1, 0)
    assert opt is not None
    if lay.shard_stage in (1, 2) and not dp_overlaps(lay, sl.stack)[1]:
        for size, axis, degree in ((params, lay.data_axis, lay.data_degree), (experts, "edp", sl.edp)):
            if degree > 1 and size > 0:
                sl.dp_collective(ALL_GATHER, axis, 2.0 * size, "dp.param_all_gather", (opt.idx,))


def embedding_sync_bytes(model: ModelSpec, layout: LayoutConfig, train: TrainConfig, held: set[int], n_virtual: int,
                         stack: SoftwareStack) -> float:
    """Bytes of the embedding-gradient all-reduce a rank holding virtual stages ``held`` runs after its
    gradient reductions and before the optimizer step (0 where it runs none).

    Megatron-core's ``finalize_model_grads._allreduce_word_embedding_grads`` all-reduces the main
    gradient of the input embedding (V x h / tp, in the gradient dtype) between the first and the last
    pipeline stage when the LM head is tied to it or MTP shares it (``mtp_num_layers``), blocking;
    DeepSpeed's pipeline engine does the same for its tied modules (``_exec_reduce_tied_grads``, the
    fp32 high-precision gradient). Nothing crosses stages when one rank holds both ends (V-shaped
    schedules) or the model shares no embedding; ``torch.distributed.pipelining`` keeps no embedding
    group (each stage owns its parameters).
    """
    if layout.pp == 1 or stack.torch_pipelining or not (model.tied_embeddings or model.mtp_depth > 0):
        return 0.0
    if (0 in held) == (n_virtual - 1 in held):
        return 0.0
    grad_b = train.grad_bytes
    return grad_b * model.embedding_params() / layout.tp


def _param_gathers_at_start(sl: _StageLowering) -> None:
    """ZeRO-1/2 with overlapped parameter gather: the previous step's updated parameters are
    all-gathered bucket by bucket while this step's forward runs (Megatron --overlap-param-gather);
    each chunk's first forward waits for its buckets."""
    lay = sl.run.layout
    if lay.shard_stage not in (1, 2) or not dp_overlaps(lay, sl.stack)[1]:
        return
    bucket = lay.grad_bucket_MiB * MiB
    for c in range(len(sl.layers)):
        ids = []
        for params, axis, degree in ((sl.chunk_params(c), lay.data_axis, lay.data_degree),
                                     (sl.chunk_expert_params(c), "edp", sl.edp)):
            size = 2.0 * params if degree > 1 else 0.0
            while size > 0:
                part = min(size, bucket)
                ids.append(sl.dp_collective(ALL_GATHER, axis, part, "dp.param_all_gather", ()).idx)
                size -= part
        if ids:
            sl.param_gathers[c] = ids


def _layer_plan(run: RunConfig, block: BlockBuilder, layer: int) -> LayerPlan:
    """Costs and memory of global layer ``layer`` (dense or MoE) on one rank."""
    shape = activation_shape(run.train, run.layout, run.model)
    modules = run.layout.recompute_modules if run.layout.recompute == "selective" else ()
    selective = "core_attn" in modules and not shape.flash
    m, lay = run.model, run.layout
    experts = m.layer_routed_expert_params(layer) if m.is_moe else 0
    etp = lay.expert_tp
    w_in = weight_grad_input_bytes(m, shape, layer)
    act = layer_activation_bytes(m, shape, recompute_attention=selective, layer=layer, recompute=modules)
    kernels = block.selective_recompute(layer, modules)
    recompute: list[Segment] = [kernels] if kernels else []
    rebuilt = 0.0
    if lay.recompute == "op_sac":
        # torchtitan op-level SAC: its saved tensors, and the rest rebuilt before the layer's backward
        # (bounded by what the layer keeps without recompute); FP8 saves matmul outputs in BF16 there
        full, act = act, op_sac_activation_bytes(m, shape, layer, compiled=run.train.stack_spec.compiled_blocks)
        recompute, rebuilt = block.op_sac_recompute(layer), max(full - act, 0.0)
        w_in = min(w_in, act)
    elif run.train.precision == "fp8":
        # linear-layer inputs are saved as their FP8 casts for backward (Transformer Engine saves the
        # quantised input; DeepSeek-V3 sec. 3.3.3 caches activations in FP8): half of their BF16 bytes
        act, w_in = act - 0.5 * w_in, 0.5 * w_in
    bwd = block.layer_backward(layer)
    bwd_input = [seg if not isinstance(seg, tuple) else tuple(k for k in seg if not k.name.endswith(".wgrad"))
                 for seg in bwd]
    bwd_weight = tuple(k for seg in bwd if isinstance(seg, tuple) for k in seg if k.name.endswith(".wgrad"))
    return LayerPlan(
        fwd=block.layer_forward(layer), bwd=bwd, bwd_input=[seg for seg in bwd_input if seg], bwd_weight=bwd_weight,
        weight_bytes=w_in,
        act_bytes=act,
        ckpt_bytes=layer_checkpoint_bytes(m, shape),
        transient_bytes=_backward_transient(run, block, shape, layer),
        params_per_rank=(m.layer_params(layer) - experts) / lay.tp,
        selective=recompute,
        recompute_bytes=rebuilt if recompute else 0.0,
        expert_params_per_rank=experts / (lay.ep * etp),
    )


def _backward_transient(run: RunConfig, block: BlockBuilder, shape: ActivationShape, layer: int) -> float:
    """The largest buffers one layer's backward holds beside its saved activations: the MLP's gradient
    pair, or under torch's ring attention the CP buffers of the attention backward, which runs after the
    MLP's backward has freed the MLP intermediates (``memory.torch_cp_backward_transient_bytes``)."""
    m = run.model
    mlp = backward_transient_bytes(m, shape, layer)
    if not (block.torch_cp and block.cp_comm == "p2p") or run.layout.cp <= 1:
        return mlp
    ring = torch_cp_backward_transient_bytes(m, shape, run.layout.cp) - mlp_intermediate_bytes(m, shape, layer)
    return max(mlp, ring)


def layer_plans(run: RunConfig, block: BlockBuilder, n_layers: int) -> dict[int, LayerPlan]:
    """Plans of layers 0..n_layers-1, built once per distinct layer structure (dense/MoE, window)."""
    m = run.model
    by_kind: dict[tuple[bool, int | None], LayerPlan] = {}
    out = {}
    for i in range(n_layers):
        key = (m.is_moe_layer(i), m.attention_window(i))
        if key not in by_kind:
            by_kind[key] = _layer_plan(run, block, i)
        out[i] = by_kind[key]
    return out


def _chunk_memory(sl: _StageLowering, chunk: int) -> ChunkMemory:
    """The ledger deltas of one chunk of a stage (see ``chunk_memory``)."""
    m, shape = sl.run.model, sl._shape
    plans = [sl.plan(chunk, i) for i in range(sl.layers[chunk])]
    edges = (embedding_activation_bytes(m, shape), head_activation_bytes(m, shape), sl._loss_transient)
    mtp = sl._mtp() if sl.vstage(chunk) == sl.n_virtual - 1 else []
    return chunk_memory(plans, sl.vstage(chunk), sl.n_virtual - 1, sl.run.layout, edges, mtp,
                        edge_segments(sl.block, sl.run.layout))


def chunk_memory(plans: list[LayerPlan], v: int, last: int, layout: LayoutConfig,
                  edges: tuple[float, float, float], mtp: list[LayerPlan],
                  steps: EdgeSegments | None = None) -> ChunkMemory:
    """Ledger deltas of one chunk, as the emitters above attach them (its forward, backward, split
    backward B and W; MTP blocks and the loss on the last position ``last``), for the closed-form
    peak (``memory.closed_form_peak``) and layout search's estimate. ``plans``: the chunk's layers in
    order; ``edges``: embedding, head and loss-transient bytes. With ``steps`` (the embedding's and
    head's segments), one entry per emission step (``segment_marks``, zeros where a step carries no
    delta): DualPipe's overlapped pairs interleave their chains step by step, and a layer of several
    compute segments allocates on its first and frees on its last, so entries per layer would pair the
    two chains' deltas differently from the ledger (2-3 % of the peak under TP or EP). Without it,
    one entry per delta-carrying op (enough for a sequential walk)."""
    emb, head, loss = edges
    ov = steps.tp_overlap if steps is not None else None

    def seg(segs: list[Segment], start: float, end: float) -> list[tuple[float, float]]:
        return per_step(segs, ov, start, end)

    def edge(name: str, start: float, end: float) -> list[tuple[float, float]]:
        return [(start, end)] if steps is None else seg(getattr(steps, name), start, end)

    mem = ChunkMemory()
    rec = recomputed_layers(layout, len(plans))
    if v == 0:
        mem.fwd += edge("embedding_fwd", emb, 0.0)
    offload = layout.offload_activation_layers
    sync = {w: k for k, w in enumerate(sync_layers(len(plans), offload))} if offload else {}
    for j, p in enumerate(plans):
        mem.fwd += seg(p.fwd, p.act_bytes, -(p.act_bytes - p.ckpt_bytes) if j < rec else 0.0)
        if j in sync:  # the wait for offload copy k frees layer k's GPU copy (``_Offload``)
            mem.fwd.append((-plans[sync[j]].act_bytes, 0.0))
    if v == last:
        mem.fwd += edge("head_fwd", head, 0.0)
        for p in mtp:
            mem.fwd += seg(p.fwd, p.act_bytes, 0.0) + edge("head_fwd", head, 0.0)
        for p in reversed(mtp):
            tail = edge("head_bwd", 0.0, -head) + seg(p.bwd, p.transient_bytes, -(p.act_bytes + p.transient_bytes))
            mem.bwd += tail
            mem.bwd_input += tail
        mem.bwd += edge("head_bwd", loss, -head - loss)
        mem.bwd_input += edge("head_bwd", loss, -head - loss)
    selective = layout.recompute in ("selective", "op_sac")
    for j in reversed(range(len(plans))):
        p = plans[j]
        again = j < rec
        if j in sync:  # layer k's buffers are allocated again when its reload starts
            mem.bwd.append((plans[sync[j]].act_bytes, 0.0))
            mem.bwd_input.append((plans[sync[j]].act_bytes, 0.0))
        freed = (p.ckpt_bytes + p.act_bytes if again else p.act_bytes) + p.transient_bytes
        if again:
            mem.bwd += seg(p.fwd, p.act_bytes, 0.0)
            mem.bwd_input += seg(p.fwd, p.act_bytes, 0.0)
        elif p.selective and selective:
            mem.bwd += seg(p.selective, p.recompute_bytes, 0.0)
            mem.bwd_input += seg(p.selective, p.recompute_bytes, 0.0)
            freed += p.recompute_bytes
        mem.bwd += seg(p.bwd, p.transient_bytes, -freed)
        mem.bwd_input += seg(p.bwd_input, p.transient_bytes, -(freed - p.weight_bytes))
        mem.wgt.append((0.0, -p.weight_bytes))
    if v == 0:
        mem.bwd += edge("embedding_bwd", 0.0, -emb)
        mem.wgt += edge("embedding_bwd", 0.0, -emb)
    return mem


def recomputed_layers(layout: LayoutConfig, n_layers: int) -> int:
    """How many leading layers of a chunk of ``n_layers`` full recompute re-runs (``recompute_layers``)."""
    if layout.recompute != "full":
        return 0
    return n_layers if layout.recompute_layers is None else min(layout.recompute_layers, n_layers)


def microbatches(run: RunConfig) -> int:
    """Micro-batches per step per DP rank: global sequences / (micro-batch x dp)."""
    return run.train.global_batch_seqs_resolved // (run.train.micro_batch_size * run.layout.dp)


def pp_runtime_bytes(model: ModelSpec, lay: LayoutConfig, train: TrainConfig, positions: list[int], last: int,
                     microbatches: int) -> float:
    """Bytes the stack's pipeline runtime keeps on a stage (chunks at route ``positions``, the last
    at ``last``) for the whole step: torch pipelining's buffers (``memory.pipeline_stage_buffer_bytes``)
    under PP, nothing otherwise."""
    if lay.pp == 1 or not train.stack_spec.torch_pipelining:
        return 0.0
    shape = activation_shape(train, lay, model)
    return pipeline_stage_buffer_bytes(model, shape, positions, last, microbatches)


def build_block(model: ModelSpec, lay: LayoutConfig, train: TrainConfig) -> BlockBuilder:
    """The BlockBuilder of one micro-batch of this layout, precision and stack (lowering and the search
    estimate build the same one). Stack switches: ``fp8_tp_gather`` (tensorwise FP8 with sequence
    parallelism only), ``dtensor_tp``, ``torch_cp``."""
    shape = activation_shape(train, lay, model)
    stack = train.stack_spec
    sp = lay.sequence_parallel and lay.tp > 1
    tensorwise_sp = sp and train.precision == "fp8" and train.fp8_recipe == "current"
    return BlockBuilder(model, shape.b, shape.s, lay.tp, lay.sequence_parallel, shape.flash,
                        shape.dropout, lay.cp, lay.cp_comm, lay.ep, lay.expert_tp,
                        # DualPipe and DualPipeV overlap one chunk's dispatch/combine with the other's
                        # compute (deepseek-ai/DualPipe: dualpipe.py, dualpipev.py)
                        lay.ep_comm_overlap or lay.pipeline_schedule.overlaps_forward_backward,
                        1.0 if train.precision == "fp8" and train.fp8_recipe == "blockwise" else 2.0,
                        amax_casts=fp8_amax_casts(stack, tensorwise_sp),
                        fp8_tp_gather=stack.fp8_tp_gather and tensorwise_sp,
                        dtensor_tp=stack.dtensor_tp, tp_overlap=tp_overlap_on(lay), torch_cp=stack.torch_cp,
                        expert_load=shape.expert_load, tp_async_grad_allreduce=stack.tp_async_grad_allreduce,
                        ep_dedup=ep_dedup(model, lay))


def ep_dedup(model: ModelSpec, lay: LayoutConfig) -> bool:
    """Whether MoE dispatch sends a token once per remote node (``layout.ep_dispatcher``: deepep, or auto
    with node-limited routing)."""
    if lay.ep_dispatcher == "auto":
        return model.moe is not None and model.moe.group_limited
    return lay.ep_dispatcher == "deepep"


def lower(run: RunConfig, cost: ComputeCostModel, host_Bps: float = 0.0) -> Lowered:
    """``lower_program``, then every program costed by ``cost`` (``cost_pass.cost_program``).

    ``host_Bps``: GPU <-> host copy rate per direction (bytes/s), needed when the layout offloads
    activations (``NodeSpec.host_link_Bps``); it replaces ``cost.host_Bps`` when given."""
    if run.layout.offload_activation_layers and max(host_Bps, cost.host_Bps) <= 0:
        raise ValueError("offloading activations needs the GPU <-> host copy rate host_Bps > 0")
    source = replace(cost, host_Bps=host_Bps) if host_Bps > 0 else cost
    lowered = lower_program(run)
    return replace(lowered, programs=[cost_program(p, source) for p in lowered.programs])


def lower_program(run: RunConfig) -> Lowered:
    """Lower a validated run into one program per pipeline stage, with sends matched to receives: the
    hardware-neutral program (kernel descriptors, no times; ``cost_pass.cost_program`` costs it)."""
    lay = run.layout
    m = microbatches(run)
    block = build_block(run.model, lay, run.train)
    sched = lay.pipeline_schedule
    route = sched.route(lay.pp, m, lay.vpp)
    layers = split_layers(run.model.n_layers, lay.pp, lay.vpp, route)
    plans = layer_plans(run, block, run.model.n_layers + run.model.mtp_depth)
    firsts = first_layers(layers, route)
    schedule = sched.actions(lay.pp, m, lay.vpp)
    lowered = Lowered(programs=[], schedule=schedule, chunk_memory=[], layers=layers, microbatches=m)
    stages = []
    for s in range(lay.pp):
        sl = _StageLowering(run, s, layers[s], plans, firsts[s], block, route, split_backward_keys(schedule[s]))
        _param_gathers_at_start(sl)
        _emit_actions(sl, schedule[s])
        _finish_stage(sl)
        stages.append(sl)
        chunks = range(len(layers[s]))
        lowered.chunk_memory.append({c: _chunk_memory(sl, c) for c in chunks})
        lowered.stage_params.append(sum(sl.chunk_params(c) for c in chunks))
        lowered.stage_expert_params.append(sum(sl.chunk_expert_params(c) for c in chunks))
        lowered.stage_layer_params.append(sum(sl.plan(c, i).params_per_rank + sl.plan(c, i).expert_params_per_rank
                                              for c in chunks for i in range(layers[s][c])))
        lowered.stage_pp_buffers.append(pp_runtime_bytes(run.model, lay, run.train,
                                                         [sl.vstage(c) for c in chunks], sl.n_virtual - 1, m))
    lowered.max_layer_params = max(p.params_per_rank + p.expert_params_per_rank for p in plans.values())
    _match_sends(stages)
    lowered.programs = [sl.prog for sl in stages]
    return lowered


def _emit_actions(sl: _StageLowering, actions: list[Action]) -> None:
    """Emit a stage's actions in order; an F flagged ``overlap_with_next`` runs with the next action
    as one overlapped pair. A chunk's last backward (or W, when split) reduces its gradients."""
    last = {}
    for a in actions:
        if a.kind == ("W" if (a.microbatch, a.chunk) in sl.split else "B"):
            last[a.chunk] = a.microbatch
    i = 0
    while i < len(actions):
        a = actions[i]
        steps = sl.steps(a, a.kind != "F" and a.microbatch == last.get(a.chunk))
        if a.overlap_with_next and i + 1 < len(actions):
            b = actions[i + 1]
            sl.run_pair(steps, sl.steps(b, b.kind != "F" and b.microbatch == last.get(b.chunk)))
            i += 2
            continue
        for _ in steps:
            pass
        i += 1


def first_layers(layers: list[list[int]], route: Route) -> list[list[int]]:
    """Global index of each (stage, chunk)'s first layer: layers run in path order (position).

    DualPipe holds the model twice, once per direction: chunk 0 of stage s and chunk 1 of stage p - 1 - s
    are the same position (deepseek-ai/DualPipe dualpipe.py), so each gets that position's first layer."""
    count_at = {route.position(0, s, c): n for s, row in enumerate(layers) for c, n in enumerate(row)}
    first_at, offset = {}, 0
    for pos in range(route.length):
        first_at[pos] = offset
        offset += count_at[pos]
    return [[first_at[route.position(0, s, c)] for c in range(len(row))] for s, row in enumerate(layers)]


def _match_sends(stages: list[_StageLowering]) -> None:
    """Point each receiving op at the send that feeds it: (kind, mb, dst virtual stage)."""
    index = {key: (sl.stage, idx) for sl in stages for key, idx in sl.sends.items()}
    for sl in stages:
        for op_idx, key in sl.em.recv_ops.items():
            sl.prog.ops[op_idx].remote = index[key]
