"""Memory accounting: what each rank holds, in bytes, and the closed-form peak.

Static state follows the ZeRO paper's accounting as tabulated in the reference (Table C):
bf16 weights 2 bytes/param, gradients in the accumulation dtype (2 or 4 bytes; Megatron keeps an
fp32 ``main_grad``), Adam's fp32 master weights + m + v = 12 bytes/param (SGD with momentum: 8),
with ZeRO-1 sharding the optimizer, ZeRO-2 also the gradients, ZeRO-3/FSDP also the weights over the
sharding group (PyTorch FSDP keeps no bf16 shard: its fp32 shard is the master; ``static_memory``). Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) term by term,
generalised to GQA and SwiGLU as in the reference's Llama breakdown; FlashAttention drops the
5*a*s^2*b softmax/dropout terms and keeps a fp32 log-sum-exp (4*a*s*b).

The per-layer terms (what each norm, attention, MLP or MoE keeps, and what recompute drops) are
written once, on the components of ``simtrain.spec.layer_desc`` (``ModelSpec.layer``); the functions
here sum them and apply the TP/SP sharding.

``ledger`` deltas attached to ops by lowering come from the functions here, and
``closed_form_peak`` walks the pipeline schedule at the same layer granularity without the engine,
so the two must agree (tested to 1 %).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest

from simtrain.lower.nvfp4 import NVFP4_WEIGHT_CACHE_BYTES
from simtrain.plan.routing import worst_rank_load
from simtrain.plan.schedules import Action, split_backward_keys
from simtrain.spec.config import DEFAULT_BUCKET_MiB, LayoutConfig, TrainConfig
from simtrain.spec.layer_desc import MLP, ActivationShape, Attention, MoE, Norm, RecomputeModule, SavePolicy
from simtrain.spec.model_spec import ModelSpec

MiB = 1024.0**2
CUBLAS_WORKSPACE_BYTES = 32 * MiB  # cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG default 4 MiB x 8)


def activation_shape(train: TrainConfig, layout: LayoutConfig, model: ModelSpec) -> ActivationShape:
    """The activation shape of this run (dropout defaults on for GELU/GPT-style models)."""
    dropout = train.dropout if train.dropout is not None else model.activation == "gelu"
    sp = layout.sequence_parallel
    gathered = sp and layout.tp > 1 and train.stack_spec.dtensor_tp
    return ActivationShape(b=train.micro_batch_size, s=train.seq_len // layout.cp, t=layout.tp,
                           sp=sp, flash=train.attention_kernel == "flash", dropout=dropout,
                           expert_load=worst_rank_load(model, train, layout), gathered_inputs=gathered)


def _replicated_bytes(a: ActivationShape, norm_inputs: float, linear_inputs: float) -> float:
    """Bytes of the TP-replicated activations on this rank: the norms' inputs (/t with SP) and the
    column-parallel linears' inputs (/t with SP, unless ``a.gathered_inputs`` keeps them whole)."""
    if not a.sp:
        return norm_inputs + linear_inputs
    return norm_inputs / a.t + (linear_inputs if a.gathered_inputs else linear_inputs / a.t)


def moe_mlp_activation_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """Bytes an MoE block keeps for backward (before the /t of TP/SP sharding) on the busiest EP rank.

    Per routed token copy (tokens x top_k, times ``a.expert_load`` under skewed routing): the permuted
    input (2h, the up-projection's wgrad input) and the expert intermediates (as a dense MLP of width
    f_e: 2 per projection output); the shared experts as a dense MLP on every token; the router's fp32
    probabilities (4 x experts per token). Megatron-core keeps these in ``MoELayer`` (``experts.py``
    GroupedMLP, ``router.py``). The formula is ``simtrain.spec.layer_desc.MoE.intermediate_bytes``.
    """
    return model.moe_component().intermediate_bytes(a)


#: Software stacks whose saved activations ``layer_activation_bytes`` models. ``fused`` (the default):
#: fused kernels as in Megatron-core / Transformer Engine (a norm keeps its bf16 input, SwiGLU keeps
#: its inputs), the Korthikanti terms below. ``eager_hf``: eager PyTorch as in Hugging Face
#: transformers' Llama (checked against torch's saved tensors in tests/calibration): each RMSNorm
#: keeps its fp32 upcast input (4 sbh), the normalised bf16 tensor (2 sbh) and the fp32 rsqrt per
#: token (4 sb) instead of its bf16 input (2 sbh), and SwiGLU also keeps silu(gate) (2 sbf).
ACTIVATION_STACKS = ("fused", "eager_hf")


def layer_activation_bytes(model: ModelSpec, a: ActivationShape, recompute_attention: bool = False,
                           layer: int | None = None, recompute: tuple[str, ...] = (),
                           stack: str = "fused") -> float:
    """Bytes one transformer layer keeps for backward for one micro-batch (no full recompute).

    Korthikanti Table 2 terms (bytes, BF16, s*b*h units): replicated across TP unless SP:
    2 norm inputs (2+2), QKV input 2, MLP input 2, two dropout masks (1+1); sharded by TP: Q 2,
    K and V 2*2*g/a, attention output 2, MLP intermediates 2*f/h each (GELU: input and output;
    SwiGLU: gate, up and product), unfused attention softmax/dropout 5*a*s/h. ``stack``
    (``ACTIVATION_STACKS``) adds what an eager stack keeps on top of these. ``recompute``
    (``recompute_modules``; Megatron-core selective recompute, DeepSeek-V3 3.3.2) stops saving:
    ``layernorm`` the two norm outputs (QKV and MLP inputs, 2+2 sbh), ``mla_up_proj`` Q, K, V (rebuilt
    from the saved latents: q d_c', kv d_c + d_rope per token), ``act`` the activation output.
    Each term is its component's (``ModelSpec.layer`` -> ``simtrain.spec.layer_desc``); this function
    sums them in forward order and applies the TP/SP sharding.
    """
    if stack not in ACTIVATION_STACKS:
        raise ValueError(f"unknown activation stack {stack!r}; known: {', '.join(ACTIVATION_STACKS)}")
    policy = SavePolicy(core_attn=recompute_attention, modules=frozenset(RecomputeModule(m) for m in recompute),
                        eager_hf=stack == "eager_hf")  # fmt: skip
    saved = model.layer(layer).saved(a, policy)
    return _replicated_bytes(a, saved.replicated, saved.linear_inputs) + saved.sharded / a.t


#: torchtitan's op-level selective activation checkpointing (``activation_checkpoint.mode: selective``,
#: ``selective_ac_option: op``; ``torchtitan/models/llama3/parallelize_llama.py``
#: ``_apply_ac_to_transformer_block``): the block is checkpointed with a policy that saves the outputs
#: of ``aten.mm``, SDPA (flash / memory-efficient), TP ``reduce_scatter_tensor`` and ``aten.max``
#: (FP8 amax), except every second ``aten.mm`` (a per-block counter: the 2nd, 4th, ... matmul is
#: recomputed), and recomputes everything else in backward. The counter is a fresh
#: ``defaultdict(int)`` per checkpoint call (``selective_checkpointing_context_fn``), so the 1st, 3rd, ...
#: matmuls are the saved ones, eager or compiled (tests/calibration/test_op_sac_saved_memory.py runs
#: the policy). Float8 linears (torchao ``Float8Linear``, Dec 2024) still dispatch ``aten.mm`` on their
#: float8 tensor subclass, so they follow the same policy.


def op_sac_linears(model: ModelSpec, layer: int | None = None) -> list[tuple[str, int, int, str]]:
    """The matmuls of one block in forward order, as torchtitan's Llama runs them (separate wq, wk, wv,
    then wo; feed-forward w1, w3, w2): (name, in features, out features, TP style), style ``col``
    (output sharded over TP), ``row`` (input sharded; each rank's output is a partial sum of the full
    width, reduce-scattered after) or ``rep`` (replicated: MLA's down projections). An MoE layer lists
    only its attention (grouped expert GEMMs are not ``aten.mm``; see ``op_sac_activation_bytes``)."""
    block = model.layer(layer)
    return [(lin.name, lin.d_in, lin.d_out, lin.tp.value)
            for c in block.components if isinstance(c, Attention | MLP) for lin in c.linears()]  # fmt: skip


def op_sac_recomputed(model: ModelSpec, layer: int | None = None) -> list[tuple[str, int, int, str]]:
    """The matmuls op-level SAC recomputes: the 2nd, 4th, ... of ``op_sac_linears``."""
    return op_sac_linears(model, layer)[1::2]


def op_sac_activation_bytes(model: ModelSpec, a: ActivationShape, layer: int | None = None,
                            compiled: bool = False) -> float:
    """Bytes one layer keeps for backward under torchtitan's op-level SAC, one micro-batch.

    The block input (2sbh, /t with SP), the bf16 output of every saved matmul (column-parallel
    2*T*out/t; row-parallel 2*T*out, the partial sum before the reduce-scatter), every TP
    reduce-scatter output (2*T*h/t, TP > 1 with SP), and the attention output (2*T*a*d_v/t) with its
    fp32 log-sum-exp (4*T*a/t, flash kernels). MoE layers keep their MoE block's activations as
    without recompute (``moe_mlp_activation_bytes``): grouped expert GEMMs are not saved by name,
    a case the policy was not written for.

    ``compiled`` (the block under ``torch.compile``): AOTAutograd's partitioner saves only what the
    backward graph reads, so the row-parallel outputs (attention out-projection, MLP down-projection,
    and their reduce-scatters), whose only reader is the residual add, are not kept although the
    policy marks them MUST_SAVE; eager SAC caches every MUST_SAVE output until the recompute. Measured
    with torch on CPU (``tests/calibration/test_op_sac_saved_memory.py``): a compiled Llama block keeps the block
    input, wq, wv and w1 outputs, the attention output and its log-sum-exp, but not w2's output.
    """
    tokens = float(a.tokens)
    t = a.t
    saved = 2.0 * tokens * model.hidden / (t if a.sp else 1)
    for i, (_, _, d_out, style) in enumerate(op_sac_linears(model, layer)):
        if style == "row" and compiled:
            continue  # read by nothing the backward needs
        if style == "row" and t > 1 and a.sp:
            saved += 2.0 * tokens * d_out / t  # the reduce-scatter output, saved whatever the matmul's parity
        if i % 2:
            continue  # recomputed
        saved += 2.0 * tokens * d_out / (t if style == "col" else 1)
    block = model.layer(layer)
    core = block.attention.core
    saved += 2.0 * tokens * core.heads * core.d_v / t
    if a.flash:
        saved += 4.0 * tokens * core.heads / t
    if isinstance(block.ffn, MoE):
        saved += block.ffn.intermediate_bytes(a) / t
    return saved


def layer_checkpoint_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """Bytes kept per layer under full recompute: the layer input (2*s*b*h, /t with SP)."""
    x = 2.0 * a.tokens * model.hidden
    return x / a.t if a.sp else x


def weight_grad_input_bytes(model: ModelSpec, a: ActivationShape, layer: int | None = None) -> float:
    """Bytes a split backward keeps from B (input grads) until W (weight grads): the inputs of the
    linear layers (QKV and MLP inputs 2sbh each, replicated unless SP; out-proj input and MLP-down
    input, sharded by TP; Korthikanti Table 2 terms), which the weight-gradient GEMMs read."""
    block = model.layer(layer)
    linear_inputs = sum(n.saved(a, SavePolicy()).linear_inputs for n in block.of(Norm))
    sharded = block.attention.wgrad_input_bytes(a) + block.ffn.wgrad_input_bytes(a)
    return _replicated_bytes(a, 0.0, linear_inputs) + sharded / a.t


def backward_transient_bytes(model: ModelSpec, a: ActivationShape, layer: int | None = None) -> float:
    """Gradient buffers alive during one layer's backward: dY of the MLP up-projection and dX.

    The largest pair of tensors the autograd engine holds at once inside a layer's backward; in an
    MoE layer the up-projection output covers tokens x top_k copies of the expert width.
    """
    return 2.0 * a.tokens * (model.layer(layer).ffn.up_output_elements(a) / a.t + model.hidden)


def torch_cp_backward_transient_bytes(model: ModelSpec, a: ActivationShape, cp: int) -> float:
    """Bytes torch's ring attention holds in one layer's attention backward under context parallelism.

    ``torch/distributed/tensor/experimental/_attention.py`` (torch 2.6, ``_templated_ring_attention_backward``
    with the default all-gather rotater): the local K and V, expanded to the query heads (torchtitan calls
    ``repeat_kv`` before SDPA), are all-gathered once into a buffer of every CP rank's shard (bf16,
    ``cp`` x K and V); each step concatenates the local K and V again (bf16); dQ, dK and dV accumulate in
    fp32 (``convert_to_f32``; dQ stays local, dK and dV travel the ring through an all-to-all rotater:
    the received buffer the accumulators view, the next concatenation and the exchange's output, 3 x fp32
    dK and dV); each step's bf16 dQ, dK, dV from the flash backward are alive beside the previous
    step's until reassigned (2 x bf16), and the flash backward keeps its fp32 dQ accumulator. In
    elements of the local tokens (q: tokens x heads/t x d_qk; kv: K and V expanded, d_qk + d_v per
    head), bytes: kv x (2 cp gathered + 2 concatenated + 3 x 4 fp32 ring + 2 x 2 step grads) + q x (4 fp32
    dQ + 2 x 2 step grads + 4 flash accumulator). torch runs no ring at cp = 1 (0).
    """
    if cp <= 1:
        return 0.0
    attention = model.layer().attention
    q = float(a.tokens) * attention.q_dim / a.t
    kv = float(a.tokens) * attention.core.heads * (attention.core.d_qk + attention.core.d_v) / a.t
    return (2.0 * cp + 2.0 + 3 * 4.0 + 2 * 2.0) * kv + (4.0 + 2 * 2.0 + 4.0) * q


def mlp_intermediate_bytes(model: ModelSpec, a: ActivationShape, layer: int | None = None) -> float:
    """Bytes of one layer's MLP intermediates on this rank (/t), which its backward frees before the
    attention backward starts: a dense MLP's projection outputs (2 bytes x tokens x f per output; SwiGLU:
    gate, up and product), an MoE block's routed-expert activations (``moe_mlp_activation_bytes``)."""
    return model.layer(layer).ffn.intermediate_bytes(a) / a.t


def head_activation_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """Last stage, per micro-batch: final-norm input, LM-head input and fp32 logits (4*s*b*V/t)."""
    x = 2.0 * a.tokens * model.hidden
    return (x / a.t if a.sp else x) + 2.0 * a.tokens * model.hidden + 4.0 * a.tokens * model.vocab / a.t


def loss_backward_transient_bytes(model: ModelSpec, a: ActivationShape, eager_loss: bool,
                                  loss_parallel: bool = False) -> float:
    """Extra bytes the loss's backward holds on the last stage, per micro-batch.

    An eager ``F.cross_entropy(logits.float(), labels)`` (torchtitan ``cross_entropy_loss``; Hugging
    Face) saves the fp32 log-softmax output (the 4*s*b*V/t of ``head_activation_bytes``); its backward
    allocates the fp32 gradient of that output (nll_loss backward) and the fp32 gradient of its input
    (log_softmax backward) while the saved output is alive: 2 x 4*s*b*V/t more at that moment. Under
    torch's ``loss_parallel`` (vocab-sharded DTensor logits, TP > 1; torchtitan's default) the two
    backwards run as one decomposed function (``torch/distributed/tensor/parallel/loss.py``,
    ``_nll_loss_and_log_softmax_backward``: ``(zeros_like(x) + exp(x)) * grad_output``), which holds
    three fp32 logit-sized tensors beside the saved output at once (the zeros, the exponential or the
    sum, the product): 3 x 4*s*b*V/t. A fused cross-entropy (Megatron-core vocab-parallel,
    Inductor-compiled) writes its gradient in place of the saved softmax: nothing extra (0).

    The eager loss also leaves a hole the caching allocator cannot use: the LM head's bf16 logits
    (2*s*b*V/t) are freed by the ``.float()`` right after they are written, and their block, too small
    for any fp32 logit-sized tensor that follows, stays reserved. Placing the loss's tensors in op order
    with the allocator's best fit (``DeviceCachingAllocator::get_free_block``, the smallest cached block
    that fits; freed neighbours coalesce) gives a high-water mark 2 B per logit above the live peak in
    both forms: eager (bf16 hole, fp32 logits, log-softmax; the ``del pred`` hole takes nll's gradient,
    log-softmax's gradient goes on top: 2 + 4 + 4 + 4 against 12 live) and loss-parallel (the freed
    fp32 logits and ``shifted`` hold the zeros and the exponential, their sum goes on top: 2 + 4 + 4 + 4
    + 4 against 16 live). Counted here with the transients, since the peak it raises is this one.
    """
    if not eager_loss:
        return 0.0
    copies = 3 if loss_parallel and a.t > 1 else 2
    bf16_hole = 2.0 * a.tokens * model.vocab / a.t
    return copies * 4.0 * a.tokens * model.vocab / a.t + bf16_hole


def pipeline_stage_buffer_bytes(model: ModelSpec, a: ActivationShape, positions: list[int], last: int,
                                microbatches: int) -> float:
    """Bytes ``torch.distributed.pipelining`` keeps on one rank for the whole step (torchtitan PP).

    Each ``PipelineStage`` (one per position ``v`` in ``positions``) allocates, before its first
    micro-batch, a receive buffer per micro-batch for the activations it receives (every position but
    the first) and another for the input gradients it receives (every position but ``last``),
    2*s*b*h each, /t with sequence parallelism (``stage.py``: ``_prepare_forward_infra``,
    ``_create_grad_recv_info``, one ``_make_tensor_from_meta`` per micro-batch); the last position
    keeps every micro-batch's output in ``output_chunks`` (``forward_one_chunk``) until the schedule
    merges them after the step: the logits in fp32 (4*s*b*V/t), since torchtitan's
    ``Transformer.forward`` returns ``self.output(h).float()`` (torchtitan/models/llama/model.py).
    Counted for the whole step: the outputs grow with each forward, but a one-chunk last stage holds
    one micro-batch in flight throughout, so its peak comes with all of them at the step's end at the
    same level. A received micro-batch's activation buffer is its first layer's saved input, which the
    ledger already counts while the micro-batch is in flight; that count stands in for the stage output
    the stage keeps (``fwd_cache``) until the same micro-batch's backward. The first position has no
    receive buffer, so its kept outputs (one 2*s*b*h/t per micro-batch in flight, at most pp of them)
    are not counted: under 2 % of a 405B first stage's peak.
    """
    edge = 2.0 * a.tokens * model.hidden / (a.t if a.sp else 1)
    total = 0.0
    for v in positions:
        total += microbatches * edge * ((v > 0) + (v < last))
        if v == last:
            total += microbatches * 4.0 * a.tokens * model.vocab / a.t
    return total


def embedding_activation_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """First stage, per micro-batch: int64 token ids (8*s*b) and the embedding dropout mask."""
    return 8.0 * a.tokens + (a.tokens * model.hidden / (a.t if a.sp else 1) if a.dropout else 0.0)


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one rank of a pipeline stage (after TP sharding)."""

    params: float
    layer_params: float


def static_memory(params: float, layer_params: float, model_layers_on_rank: int, layout: LayoutConfig,
                  train: TrainConfig, shard: int, gpu_context_bytes: float,
                  unsharded_params: float = 0.0, root_params: float = 0.0) -> dict[str, float]:
    """Bytes held for the whole step by one rank, by component.

    Args:
        params: parameters on this rank after TP sharding.
        layer_params: parameters of one transformer layer on this rank (for ZeRO-3 buffers).
        model_layers_on_rank: transformer layers on this rank (all chunks).
        shard: size of the parameter-sharding group (dp, or the hybrid-shard group).
        gpu_context_bytes: CUDA context + NCCL buffers.
        unsharded_params: ZeRO-3 layer parameters this rank keeps gathered for the whole step
            (``stack_rules.fsdp_keeps_unsharded``: torchtitan under PP); they and their gradients,
            accumulated unsharded in the reduce dtype (FSDP2 ``FSDPParam.to_accumulated_grad_if_needed``),
            replace the per-layer gather buffers.
        root_params: parameters outside the transformer layers on this rank (embedding, final norm, LM
            head). Under PyTorch FSDP (``SoftwareStack.torch_fsdp``) the root unit keeps them gathered
            in bf16 through forward and backward (2 B each; under PP with their accumulated gradients
            too, as ``unsharded_params``), and the sharded fp32 parameters are the optimizer's master
            weights: no separate bf16 shard (weights 0; the 12 B of master, m and v stay).
    """
    stage = layout.shard_stage
    grad_b = train.grad_bytes
    opt_b = 8.0 if train.optimizer == "sgd" else 12.0
    torch_fsdp = stage >= 3 and train.stack_spec.torch_fsdp
    weights = 0.0 if torch_fsdp else 2.0 * params / (shard if stage >= 3 else 1)
    grads = grad_b * params / (shard if stage >= 2 else 1)
    optimizer = opt_b * params / (shard if stage >= 1 else 1)
    bucket = (layout.grad_bucket_MiB or DEFAULT_BUCKET_MiB) * MiB  # ZeRO-2's two buckets (not Megatron's)
    if stage >= 3 and unsharded_params > 0 and shard > 1:
        buffers = (2.0 + grad_b) * (unsharded_params + (root_params if torch_fsdp else 0.0))
    elif stage >= 3:
        buffers = (1 + layout.fsdp_prefetch_layers) * 2.0 * layer_params + grad_b * layer_params
        buffers += 2.0 * root_params if torch_fsdp else 0.0
    elif stage == 2:
        buffers = 2 * bucket
    else:
        buffers = 0.0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "comm_buffers": buffers,
            "workspace": CUBLAS_WORKSPACE_BYTES, "context": gpu_context_bytes}


def fp8_weight_cache_bytes(layer_params: float, layout: LayoutConfig, train: TrainConfig, shard: int) -> float:
    """FP8 copies of a stage's linear weights and their transposes (1 + 1 B per parameter; NVFP4 row-wise and
    column-wise copies: 0.5625 + 0.5625, ``simtrain.lower.nvfp4``) that a stack keeps for the whole step
    (``SoftwareStack.fp8_weight_cache``: Transformer Engine caches both for fprop and dgrad), sharded with
    the weights under ZeRO-3/FSDP. A stack that re-quantises each weight at every use (torchao
    ``Float8Linear``) holds only the computing layer's casts, transiently: 0."""
    if train.precision not in ("fp8", "fp4") or not train.stack_spec.fp8_weight_cache:
        return 0.0
    per_param = NVFP4_WEIGHT_CACHE_BYTES if train.precision == "fp4" else 2.0  # NVFP4: 2 x (0.5 + 1/16) B
    return per_param * layer_params / (shard if layout.shard_stage >= 3 else 1)


def expert_static_memory(params: float, layout: LayoutConfig, train: TrainConfig, shard: int) -> dict[str, float]:
    """Weights, gradients and optimizer state of routed-expert parameters on one rank.

    Expert parameters are sharded by EP x ETP and replicated over the expert-data-parallel group,
    over which ZeRO shards them (Megatron-core distributed optimizer on the expert-DP group).
    """
    stage = layout.shard_stage
    grad_b = train.grad_bytes
    opt_b = 8.0 if train.optimizer == "sgd" else 12.0
    return {"weights": 2.0 * params / (shard if stage >= 3 else 1),
            "grads": grad_b * params / (shard if stage >= 2 else 1),
            "optimizer": opt_b * params / (shard if stage >= 1 else 1)}


@dataclass(slots=True)
class ChunkMemory:
    """Ledger deltas of one model chunk for one micro-batch, in op order.

    ``fwd`` and ``bwd`` are lists of (start_delta, end_delta) per op of the chunk's forward and
    backward in execution order, as lowering attaches them to ops.
    """

    fwd: list[tuple[float, float]] = field(default_factory=list)
    bwd: list[tuple[float, float]] = field(default_factory=list)
    bwd_input: list[tuple[float, float]] = field(default_factory=list)
    """A split backward's B (zero-bubble schedules)."""
    wgt: list[tuple[float, float]] = field(default_factory=list)
    """A split backward's W."""


def closed_form_peak(actions: list[Action], chunks: dict[int, ChunkMemory]) -> float:
    """Peak dynamic bytes (activations and backward buffers) of one stage, walking its schedule.

    This walks the stage's schedule at op granularity without any timing (each op's start delta,
    then its end delta), so it is independent of the engine and must match the ledger's peak. A B
    whose (micro-batch, chunk) also has a W is a split backward; an overlapped F&B pair interleaves
    its two actions' entries one at a time, as lowering emits them (``chunk_memory`` with ``steps``
    gives one entry per emission step).
    """
    split = split_backward_keys(actions)

    def deltas(act: Action) -> list[tuple[float, float]]:
        mem = chunks[act.chunk]
        if act.kind == "F":
            return mem.fwd
        if act.kind == "W":
            return mem.wgt
        return mem.bwd_input if (act.microbatch, act.chunk) in split else mem.bwd

    live = peak = 0.0
    i = 0
    while i < len(actions):
        seq = deltas(actions[i])
        if actions[i].overlap_with_next and i + 1 < len(actions):
            other = deltas(actions[i + 1])
            seq = [d for pair in zip_longest(seq, other) for d in pair if d is not None]
            i += 1
        for start, end in seq:
            live += start
            peak = max(peak, live)
            live += end
            peak = max(peak, live)
        i += 1
    return peak
