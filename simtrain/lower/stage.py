"""One pipeline stage's lowering: the ops of each schedule action (forward, backward, weight gradient,
overlapped pairs) with their sends, FSDP gathers and reduce-scatters, gradient buckets and activation
offload copies (simtrain.lower.lowering builds the stages and matches their sends)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from simtrain.lower.blocks import (
    BlockBuilder,
)
from simtrain.lower.emit import _Emitter
from simtrain.lower.kernels import MemoryBound
from simtrain.lower.layer_plan import (
    LayerPlan,
    recomputed_layers,
)
from simtrain.lower.memory import (
    activation_shape,
    embedding_activation_bytes,
    head_activation_bytes,
    loss_backward_transient_bytes,
)
from simtrain.lower.offload import sync_layers
from simtrain.lower.ops import Op, OpKind, Program, Stream
from simtrain.lower.stack_rules import (
    dp_bucket_bytes,
    dp_overlaps,
    fp32_grad_accumulation_kernel,
    fsdp1_grad_bytes,
    fsdp2_accumulates_fp32,
    fsdp_keeps_unsharded,
    grad_reduce_collective,
    synchronous_p2p,
    tp_overlap_on,
)
from simtrain.plan.schedules import Action, Route
from simtrain.spec.collective_kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SEND, Collective
from simtrain.spec.config import RunConfig
from simtrain.spec.stacks import SoftwareStack


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
    sync_p2p: bool = field(init=False)
    """The schedule's exchanges are synchronous on this stack (``stack_rules.synchronous_p2p``)."""
    prog: Program = field(init=False)
    em: _Emitter = field(init=False)
    sends: dict[tuple[str, int, int], int] = field(default_factory=dict)
    dp_ops: list[int] = field(default_factory=list)
    deferred: list[tuple[Collective, float, str]] = field(default_factory=list)
    param_gathers: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Per chunk, its overlapped parameter all-gathers in issue order, each as (the first forward unit whose
    parameters it carries, op index); units: the embedding 0, the chunk's layers 1.., the head last
    (``gather_units``)."""
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
        self.stack = self.run.train.stack_spec
        self.sync_p2p = synchronous_p2p(self.stack, len(self.layers))
        self.em = _Emitter(self.prog, tp_overlap_on(self.run.layout), self.sync_p2p)
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

    def gather_units(self, chunk: int) -> list[tuple[float, float]]:
        """(dense, routed-expert) parameters on this rank of each unit of ``chunk`` in forward order: the input
        embedding (0 off the first position), each layer, the head with the MTP modules (0 off the last)."""
        last = self.vstage(chunk) == self.n_virtual - 1
        mtp_experts = sum(p.expert_params_per_rank for p in self._mtp()) if last else 0.0
        layers = [(self.plan(chunk, i).params_per_rank, self.plan(chunk, i).expert_params_per_rank)
                  for i in range(self.layers[chunk])]
        return [(self._embed_params(chunk), 0.0), *layers, (self._head_params(chunk), mtp_experts)]

    def _gathers_for(self, chunk: int, unit: int) -> list[int]:
        """The parameter all-gathers the first forward of ``unit`` of ``chunk`` waits for and no earlier unit
        did: those carrying parameters of units up to it (Megatron's forward pre-hook waits for the bucket of
        each module's parameters, ``finish_param_sync``)."""
        pending = self.param_gathers.get(chunk, [])
        ready = [idx for first, idx in pending if first <= unit]
        self.param_gathers[chunk] = [(first, idx) for first, idx in pending if first > unit]
        return ready

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
        gathers = self.gathers_before(a.chunk, a.microbatch)
        if gathers:
            self.em.extra_deps.extend(self._gathers_for(a.chunk, 0))
        if v == 0:
            yield from self.em.segment_steps(self.block.embedding_forward(), "fwd", a.microbatch, a.chunk,
                                             mem_start=embedding_activation_bytes(self.run.model, self._shape))
        order = list(range(self.layers[a.chunk]))
        offload = _Offload(self, a) if self.run.layout.offload_activation_layers else None
        for i in order:
            plan = self.plan(a.chunk, i)
            self._fsdp_gather("F", a, order, i)
            if gathers:
                self.em.extra_deps.extend(self._gathers_for(a.chunk, i + 1))
            end = -(plan.act_bytes - plan.ckpt_bytes) if self._recompute_layer(i) else 0.0
            yield from self.em.segment_steps(plan.fwd, "fwd", a.microbatch, a.chunk, mem_start=plan.act_bytes,
                                             mem_end=end)
            if offload is not None:
                offload.after_forward(i)
        if gathers:
            self.em.extra_deps.extend(self._gathers_for(a.chunk, len(order) + 1))
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
        main, other = self.em, _Emitter(self.prog, self.em.tp_overlap, self.em.sync_recv)
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
                           microbatch=a.microbatch, chunk=a.chunk, sync_after=self.sync_p2p)
        self.sends[(kind, a.microbatch, dst_v)] = op.idx
        if self.sync_p2p:  # the compute stream waits for the send (Megatron's req.wait(), wait_on_reqs)
            self.em.extra_deps.append(op.idx)

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
    flushed: bool = False
    """Whether a bucket of this backward has been reduced (the next is no longer the step's first)."""

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
        bucket = dp_bucket_bytes(self.sl.run.layout, self.sl.stack, self._grad_bytes, self.sl.stage,
                                 self.action.chunk, first=not self.flushed)
        if (self.pending + self.pending_expert) * self._grad_bytes >= bucket:
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
        self.flushed = self.flushed or self.pending + self.pending_expert > 0
        self.pending = self.pending_expert = 0.0


class _Offload:
    """CPU activation offloading of one action's layers (``simtrain.lower.offload``): the copies on the
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
