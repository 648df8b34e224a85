"""Software stacks: what the training framework changes about the cost of the same model and layout.

The same layout runs at different speeds under Megatron-Core with Transformer Engine, torchtitan
(FSDP2, eager or ``torch.compile``), MosaicML Composer (FSDP) or DeepSpeed, because the frameworks
differ in things a user chooses: whether memory-bound ops are fused, which attention kernel runs,
how FP8 scales its tensors, which overlap features are on, and how much CPU time each kernel launch
costs. A :class:`SoftwareStack` holds those choices as documented constants; ``train.stack`` in a
RunConfig names one (default ``megatron-te``), and ``simtrain validate`` picks one from a row's
``framework`` cell with :func:`stack_from_text`.

Unfused traffic factors are [derived] from the op decomposition of the eager PyTorch code (bytes
moved through HBM per element, bf16 = 2, fp32 = 4), relative to one fused kernel that reads its
inputs and writes its output once (what ``costs.py`` charges for a fused op):

- RMSNorm eager (torchtitan ``RMSNorm._norm``: ``x.float()``, ``pow(2)``, ``mean``, ``x * rsqrt``,
  ``type_as``, ``* weight``): 2+4, 4+4, 4, 4+4, 4+2, 2+2 = 36 bytes/elem vs 4 fused, ~7 kernels.
  Backward is similar (autograd saves the fp32 intermediates): ~9x, ~8 kernels.
- RoPE eager (torchtitan ``apply_rotary_emb``: ``float()`` to complex, complex multiply,
  ``view_as_real``, ``type_as`` for q and k): 2+4, 4+4, 4+2 = 20 bytes/elem vs 4 fused: 5x, ~6 kernels.
- SwiGLU eager (``silu(w1 x) * w3 x``): silu 2+2, mul 2+2+2 = 10 vs 6 fused: ~1.7x, 2 kernels.
- Megatron-core's vocab-parallel cross-entropy without ``--cross-entropy-loss-fusion`` (off by default
  in Megatron-LM's arguments; NeMo and Megatron-Bridge recipes turn it on): ``logits.float()`` (2+4),
  max (4), subtract the max in place (4+4), exp in place (4+4), sum (4), divide in place to the saved
  softmax (4+4); backward multiplies it in place by the loss gradient (4+4) and casts it to BF16 (4+2):
  52 bytes/elem vs 16 fused (10 + 6), ~3.25x, ~7 kernels (megatron/core/tensor_parallel/cross_entropy.py).
- Residual add: one kernel either way (1x); GELU with bias eager: bias add + gelu = 2 passes (2x).
- Cross-entropy eager (``logits.float()``, ``log_softmax``, ``nll_loss``): 2+4, 4+4 (two passes
  for max and sum), 4 = 18 bytes/elem vs ~10 for a fused vocab-parallel kernel: ~1.8x.
- Ring-attention merge (context parallelism, one per ring step: the step's partial output rescaled by
  its log-sum-exp and added into the running output): Transformer Engine fuses it (``jit_fuser``
  ``flash_attn_fwd_out_correction``: read the step's bf16 output, read and write the fp32 running
  output, 10 bytes/elem); torch's ring attention (``torch.distributed.tensor.experimental._attention``
  ``_SDPAMerger.step``) runs it as eager ops: ``(out1 - out2).float()``, ``sigmoid(lse diff) *``,
  ``out1 -``, ``.to(dtype)``: 6+6+8+8+6 = 34 bytes/elem, ~3.4x, 5 kernels; it runs inside the DTensor
  dispatch of SDPA, outside the compiled regions.
- ``torch.compile`` (TorchInductor) fuses each of these chains into one or two Triton kernels that
  read and write each tensor once (Ansel et al., ASPLOS'24 "PyTorch 2", sec. 5: pointwise and
  reduction fusion), so its factors are ~1x with one or two kernels per op.

CPU launch cost per kernel: eager PyTorch spends ~5-10 us of CPU per op when CPU-bound (reference
hardware-collectives-memory.md sec. 3 "Isolation vs in situ"); FSDP2's per-parameter hooks add to
it. Inductor-compiled regions and CUDA graphs launch far less (CUDA graphs: one launch per graph).
A kernel costs max(GPU time, CPU launch time): the CPU runs ahead of the GPU until kernels get
shorter than their launch.

Attention kernels on Hopper: FlashAttention-2 (PyTorch SDPA's flash backend, flash-attn 2) reaches
~309-370 TFLOP/s forward at head dim 128 (31-37 % of the H100 dense peak), FlashAttention-3 and
cuDNN's fused attention (Transformer Engine's default on Hopper) ~467-648 TFLOP/s (47-65 %) (Shah
et al. 2024, FA3 paper Fig. 5; reference Table D). On Ampere FA2 is the best kernel; GPU profiles
hold the best kernel's efficiency, and ``fa2`` scales it on Hopper and later by ``FA2_ON_HOPPER``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from simtrain.errors import ConfigError, problem

US = 1e-6

#: FA2 / FA3 forward throughput on H100 at head dim 128: midpoints 340 / 558 TFLOP/s (FA3 paper Fig. 5,
#: reference Table D) = 0.61. Applied to GPUs with FA3-class kernels (Hopper, Blackwell) only.
FA2_ON_HOPPER = 0.61


@dataclass(frozen=True, slots=True)
class OpFusion:
    """How one kind of memory-bound op runs: HBM traffic relative to one fused pass, kernels launched."""

    bytes_factor: float = 1.0
    kernels: int = 1


FUSED = OpFusion(1.0, 1)


@dataclass(frozen=True, slots=True)
class SoftwareStack:
    """A training framework's kernel and overlap choices (constants documented in the module docstring).

    Attributes:
        name: registry key (``train.stack``).
        description: what it stands for, with versions.
        norm, rope, activation, residual, loss: fusion of each memory-bound op kind (forward and backward).
        cpu_launch_s: CPU time to launch one kernel, seconds (0 = launches never stall the GPU).
        attention: ``fa3`` (FlashAttention-3 / cuDNN fused attention), ``fa2`` (FlashAttention-2 / SDPA),
            or ``unfused`` (Megatron's fused-softmax core attention, scores materialised).
        fp8_recipe: default FP8 scaling when a run asks for fp8 without naming one.
            (the quantisation traffic of each recipe is ``simtrain.costs.FP8_CAST_BYTES``).
        tp_comm_overlap: TP communication overlapped with GEMMs by default (Megatron userbuffers /
            torchtitan async TP).
        zero_stage: default ZeRO stage when a row does not say (Megatron distributed optimizer = 1).
        sequence_parallel: sequence parallelism on whenever tp > 1.
        pp_microbatches_equal_pp: the framework splits a local batch into ``pp`` micro-batches by default
            (torchtitan ``pipeline_parallel_microbatches``) instead of taking a micro-batch size.
        eager_loss: the cross-entropy runs in eager PyTorch on an fp32 copy of the logits
            (``F.cross_entropy(logits.float(), labels)``), whose backward holds two fp32 logit-sized
            gradients beside the saved log-softmax (``memory.loss_backward_transient_bytes``).
    """

    name: str
    description: str
    norm: OpFusion = FUSED
    rope: OpFusion = FUSED
    activation: OpFusion = FUSED
    residual: OpFusion = FUSED
    loss: OpFusion = FUSED
    cpu_launch_s: float = 0.0
    attention: Literal["fa3", "fa2", "unfused"] = "fa3"
    fp8_recipe: Literal["delayed", "current", "blockwise"] = "delayed"
    tp_comm_overlap: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 0
    sequence_parallel: bool = True
    pp_microbatches_equal_pp: bool = False
    eager_loss: bool = False
    zero1_grad_all_reduce: bool = False
    """Under pipeline parallelism ZeRO-1 all-reduces the accumulated gradients instead of
    reduce-scattering them; each rank then steps its optimizer shard and all-gathers the updated bf16
    parameters (DeepSpeed's BF16_Optimizer under its pipeline engine: ``PipelineEngine._bf16_reduce_grads``
    runs ``buffered_allreduce_fallback`` on the fp32 ``get_grads_for_reduction()``)."""
    fp32_grad_accumulation_pass: bool = False
    """Under pipeline parallelism each micro-batch's BF16 gradients are added into FP32 copies by a
    separate pass after its backward, before the gradient is sent upstream (DeepSpeed ``PipelineEngine.
    _exec_backward_pass`` with the BF16 optimizer: ``optimizer.update_hp_grads(clear_lp_grads=False)``,
    per parameter ``hp_grad.add_(lp.grad.to(float32))``: 18 bytes per parameter through HBM;
    ``lowering.FP32_GRAD_ACCUMULATION_BYTES_PER_PARAM``). Megatron-core accumulates into its FP32
    ``main_grad`` inside the weight-gradient GEMM (gradient-accumulation fusion): no pass."""
    fp8_weight_cache: bool = False
    """FP8 weights are quantised once per step and reused by the step's other micro-batches (Transformer
    Engine's ``is_first_microbatch``: ``update_fp8_weights = is_first_microbatch is None or
    is_first_microbatch`` in ``te.pytorch.module.linear._Linear.forward``; Megatron-core's TE layers pass
    it unless ``disable_parameter_transpose_cache``). False: a per-tensor current-scaling forward
    re-quantises its weight every time (torchao ``Float8Linear``)."""
    pp_dp_overlap: bool = True
    """Under pipeline parallelism the data-parallel gradient reduction and the ZeRO-1/2 parameter
    all-gather overlap compute as the layout's ``overlap_grad_reduce`` / ``overlap_param_gather`` ask
    (Megatron-core). False: the framework runs them as blocking steps of its schedule, the reduction
    after the pipeline flush and the gather after the optimizer step (DeepSpeed ``PipelineEngine``:
    ``ReduceGrads`` then ``OptimizerStep`` instructions; ``lowering.dp_overlaps``)."""
    torch_pipelining: bool = False
    """Pipeline parallelism through ``torch.distributed.pipelining``, whose stages keep per-micro-batch
    receive buffers and the last stage's outputs for the whole step
    (``memory.pipeline_stage_buffer_bytes``)."""
    attn_merge: OpFusion = FUSED
    """Fusion of the ring-attention merge of each context-parallel step (module docstring)."""
    fp8_tp_gather: bool = False
    """Tensorwise FP8 casts a column-parallel layer's input on its sequence shard and all-gathers it in
    FP8 (``BlockBuilder.fp8_tp_gather``; torchao Float8ColwiseParallel, the torchtitan default)."""
    torch_cp: bool = False
    """Context parallelism through torch's ring attention (``context_parallel``; ``BlockBuilder.torch_cp``)
    rather than Transformer Engine's KV ring."""
    dtensor_tp: bool = False
    """Tensor parallelism through DTensor with separate q/k/v and gate/up linears (``BlockBuilder.dtensor_tp``):
    sequence parallelism shards the sequence dim of [batch, seq, hidden] (Shard(1)), so each unfused TP
    all-gather / reduce-scatter pays a full-tensor copy, and async TP cannot fuse the backward
    reduce-scatters of summed input gradients. Megatron-core keeps [seq, batch, hidden], gathers along
    dim 0 in place and fuses QKV and FC1 into one GEMM each."""
    fsdp_reshard_under_pp: bool = True
    """ZeRO-3/FSDP with pipeline parallelism re-gathers each layer's parameters for every micro-batch
    (True), or keeps a stage's parameters unsharded from the first forward to the end of the step and
    reduce-scatters its accumulated gradients once, after the stage's last backward (False):
    torchtitan's ``apply_fsdp`` passes ``reshard_after_forward=not pp_enabled`` ("do not reshard after
    forward to avoid per-microbatch all-gathers"), and ``torch.distributed.pipelining``'s
    ``PipelineStage.backward_maybe_with_nosync`` sets ``set_reshard_after_backward(False)`` and
    ``set_requires_gradient_sync(False)`` until the last backward, then runs FSDP's post-backward."""
    fsdp_param_copies: bool = False
    """FSDP2's per-parameter sharding copies: each all-gather is followed by a copy-out of the flat
    output into the unsharded parameters (``foreach_all_gather_copy_out``: read and write 2 bytes per
    parameter), and each reduce-scatter is preceded by a copy-in of the unsharded gradients into the
    flat input, cast to the reduce dtype (``foreach_reduce``'s ``_chunk_cat``: read 2, write the
    gradient bytes) (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). FSDP1 and ZeRO gather
    into flat buffers the parameters are views of, without a copy-out; FSDP1's gradient side is
    ``fsdp_flat_grads``."""
    foreach_optimizer: bool = False
    """The optimizer step runs PyTorch's multi-tensor (``foreach``) AdamW and ``clip_grad_norm_(foreach=True)``
    instead of one fused kernel (torchtitan's default: ``"fused": fused, "foreach": not fused`` with
    ``--optimizer.fused`` off; ``lowering.optimizer_bytes_per_param``)."""
    fsdp_flat_grads: bool = False
    """FSDP1's FlatParameter gradient path before each reduce-scatter (``lowering.fsdp1_grad_bytes``):
    autograd builds a unit's flat gradient by concatenating its parameters' gradients (the parameters are
    views split from the flat parameter, torch/distributed/fsdp/_flat_param.py ``_get_unflat_views``, whose
    backward ``split_with_sizes_backward`` is a ``cat``: read and write 2 B per parameter), casts it to a
    reduce dtype other than the parameter dtype (``_post_backward_hook``), and divides it in place by the
    gradient pre-divide factor (``_reduce_grad``: ``_div_if_needed(padded_unsharded_grad,
    _gradient_predivide_factor)``, a factor > 1 for any sharding group > 1; torch/distributed/fsdp/
    _runtime_utils.py). FSDP2 copies instead (``fsdp_param_copies``) and lets NCCL average fp32/bf16."""
    compiled_blocks: bool = False
    """The transformer blocks run under ``torch.compile``: AOTAutograd's min-cut partitioner saves for
    backward only the tensors its backward graph reads, so op-level SAC does not keep the outputs its
    policy marks MUST_SAVE that nothing in the backward reads (the row-parallel projections feeding the
    residual add; ``memory.op_sac_activation_bytes``); eager SAC caches them all until the recompute."""
    torch_fsdp: bool = False
    """ZeRO-3 is PyTorch FSDP (FSDP1 or FSDP2) under a mixed-precision policy (``memory.static_memory``):
    the sharded parameter stays in fp32 and is the optimizer's master weight, so no bf16 shard is kept
    beside it (the bf16 copy exists only unsharded, gathered; FSDP2 ``MixedPrecisionPolicy`` casts in
    ``FSDPParam.init_all_gather_outputs``; FSDP1 frees its ``_mp_shard`` after each all-gather), and the
    root unit, the parameters outside the wrapped blocks (embedding, final norm, LM head), is never
    resharded after forward: its gathered bf16 parameters live from the forward's start to the end of
    the backward (FSDP2 ``FSDPState._lazy_init`` sets the root group's ``post_forward_mesh_info = None``;
    FSDP1 ``_post_forward_reshard`` skips the root handle). DeepSpeed ZeRO-3 keeps a bf16 partition
    beside its fp32 master partition (False)."""
    tp_async_grad_allreduce: bool = False
    """Without sequence parallelism, TP's column-parallel layers all-reduce their input gradient beside
    their weight-gradient GEMM (Megatron-LM >= v2.6 ``async_grad_allreduce``, on unless
    ``--no-async-tensor-model-parallel-allreduce``; Transformer Engine's linears): ``BlockBuilder.
    tp_async_grad_allreduce``. False: after the layer's backward, blocking (BigScience's Megatron-DeepSpeed
    ``copy_to_tensor_model_parallel_region``; DTensor)."""
    grad_dtype: Literal["fp32", "bf16"] = "fp32"
    """Gradient buffer and data-parallel reduction dtype when a run does not set ``train.grad_dtype``.
    Megatron-LM accumulates into fp32 ``main_grad`` for bf16 training unless ``--grad-reduce-in-bf16``;
    NeMo's performance configs pass ``optim.grad_sync_dtype=bf16`` (NeMo-Framework-Launcher
    examples/training/*/h100/*.sh, conf/training/nemotron/nemotron_340b.yaml), which NeMo maps to
    ``DistributedDataParallelConfig(grad_reduce_in_fp32=False)`` (megatron_gpt_model.py
    ``setup_mcore_distributed_parallel``), and Megatron-Bridge's performance recipes set
    ``cfg.ddp.grad_reduce_in_fp32 = False`` (scripts/performance/configs/*): a bf16 buffer."""
    ddp_grad_passes: int = 1
    """Passes over a DDP bucket's gradients besides the all-reduce (each reads and writes them):
    Megatron-core DDP accumulates into the contiguous bucket and only scales it (1); PyTorch DDP's
    reducer copies each grad into the flat bucket, divides it by the world size and copies it back
    (3; torch/csrc/distributed/c10d/reducer.cpp, without gradient_as_bucket_view)."""

    def fusion_of(self, kernel_name: str) -> OpFusion:
        """The fusion of the memory-bound op a kernel name belongs to (names as ``simtrain.blocks`` emits)."""
        base = kernel_name.split(".")[0]
        if base.startswith(("ln", "final_norm", "norm")):
            return self.norm
        if base.startswith("rope"):
            return self.rope
        if base.startswith("act"):
            return self.activation
        if base.startswith("residual"):
            return self.residual
        if base.startswith("cross_entropy"):
            return self.loss
        if base.startswith("cp_merge"):
            return self.attn_merge
        return FUSED


# Eager PyTorch op decompositions (module docstring): RMSNorm 9x / 7 kernels, RoPE 5x / 6, SwiGLU 1.7x / 2,
# cross-entropy 1.8x / 4.
EAGER_NORM, EAGER_ROPE, EAGER_ACT, EAGER_LOSS = OpFusion(9.0, 7), OpFusion(5.0, 6), OpFusion(1.7, 2), OpFusion(1.8, 4)
# torch ring attention's eager merge of each CP step (module docstring): 34 / 10 bytes per element, 5 kernels.
EAGER_CP_MERGE = OpFusion(3.4, 5)
# Megatron-core's unfused vocab-parallel cross-entropy (module docstring): 52 / 16 bytes per element, 7 kernels.
MEGATRON_UNFUSED_LOSS = OpFusion(3.25, 7)
# What every torchtitan stack shares: FSDP2 (its copies, stages kept unsharded under PP, fp32 master shards
# and a root kept gathered), torch pipelining
# (local batch split into pp micro-batches), DTensor TP with FP8 all-gathers, torch ring attention, the
# foreach AdamW.
TORCHTITAN: Mapping[str, Any] = MappingProxyType(dict(
    pp_microbatches_equal_pp=True, fsdp_reshard_under_pp=False, fsdp_param_copies=True, attn_merge=EAGER_CP_MERGE,
    dtensor_tp=True, fp8_tp_gather=True, torch_cp=True, torch_pipelining=True, foreach_optimizer=True,
    torch_fsdp=True))
# TorchInductor: one fused Triton kernel per chain, two for reductions (norm, loss) (PyTorch 2 paper sec. 5).
COMPILED_REDUCTION = OpFusion(1.0, 2)
# Megatron legacy kernels (apex fused LayerNorm, fused bias-GELU, fused scale-mask-softmax): fused, but
# without FlashAttention (Megatron-LM 2021-2022; Korthikanti et al. 2022 sec. 5).

STACKS: dict[str, SoftwareStack] = {
    s.name: s
    for s in (
        SoftwareStack(
            "megatron-te", "Megatron-Core / NeMo with Transformer Engine (fused LayerNorm-GEMM, fused "
            "SwiGLU/RoPE/cross-entropy, cuDNN fused attention, distributed optimizer, TP comm overlap, bf16 "
            "gradient reduction); NeMo performance recipes", attention="fa3", fp8_recipe="delayed",
            tp_comm_overlap=True, zero_stage=1, cpu_launch_s=0.0, tp_async_grad_allreduce=True, grad_dtype="bf16",
            fp8_weight_cache=True),
        SoftwareStack(
            "megatron-core", "Megatron-LM / Megatron-Core training scripts with Transformer Engine, as "
            "megatron-te but with the cross-entropy unfused (--cross-entropy-loss-fusion is off unless asked)",
            loss=MEGATRON_UNFUSED_LOSS, attention="fa3", fp8_recipe="delayed", tp_comm_overlap=True, zero_stage=1,
            cpu_launch_s=0.0, tp_async_grad_allreduce=True, fp8_weight_cache=True),
        SoftwareStack(
            "megatron-legacy", "Megatron-LM 2021-2022 (apex fused LayerNorm, fused bias-GELU, fused "
            "scale-mask-softmax, no FlashAttention, no distributed optimizer)", attention="unfused",
            zero_stage=0, cpu_launch_s=0.0, tp_async_grad_allreduce=True),
        SoftwareStack(
            "torchtitan-eager", "torchtitan with FSDP2 in eager mode (unfused RMSNorm/RoPE/SwiGLU, SDPA "
            "FlashAttention-2, tensorwise dynamic float8)", norm=EAGER_NORM, rope=EAGER_ROPE,
            activation=EAGER_ACT, loss=EAGER_LOSS, attention="fa2", fp8_recipe="current", cpu_launch_s=8 * US,
            eager_loss=True, **TORCHTITAN),
        SoftwareStack(
            "torchtitan-compile", "torchtitan with FSDP2 and per-block torch.compile (Inductor-fused "
            "elementwise ops, SDPA FlashAttention-2, tensorwise dynamic float8 with fused casts); the loss "
            "is compiled too (torchtitan 2025: build_cross_entropy_loss compiles it with the model)",
            norm=COMPILED_REDUCTION, loss=COMPILED_REDUCTION,
            attention="fa2", fp8_recipe="current", cpu_launch_s=4 * US,
            compiled_blocks=True, **TORCHTITAN),
        SoftwareStack(
            "torchtitan-compile-2024", "torchtitan of 2024 with FSDP2 and per-block torch.compile; the loss "
            "ran eager (train.py: 'compiling loss function causes CUDA errors, turning off for now')",
            norm=COMPILED_REDUCTION, loss=EAGER_LOSS,
            attention="fa2", fp8_recipe="current", cpu_launch_s=4 * US,
            eager_loss=True, compiled_blocks=True, **TORCHTITAN),
        SoftwareStack(
            "composer-fsdp", "MosaicML Composer / llm-foundry with PyTorch FSDP (FlashAttention-2, "
            "low-precision LayerNorm, eager elementwise ops)", norm=OpFusion(3.0, 4),
            activation=OpFusion(2.0, 2), loss=OpFusion(1.8, 4), attention="fa2", cpu_launch_s=8 * US,
            fsdp_flat_grads=True, torch_fsdp=True),
        SoftwareStack(
            "deepspeed", "Megatron-DeepSpeed (Megatron's fused kernels, no FlashAttention, DeepSpeed ZeRO "
            "and pipeline engine; sequence parallelism is opt-in there (--sequence-parallel), and BigScience's "
            "fork that trained BLOOM (tr11 launch script) has none)",
            attention="unfused", zero_stage=1, cpu_launch_s=0.0, sequence_parallel=False,
            zero1_grad_all_reduce=True, pp_dp_overlap=False, fp32_grad_accumulation_pass=True),
        SoftwareStack(
            "pytorch-eager", "generic eager PyTorch (DDP/FSDP, unfused elementwise ops, SDPA "
            "FlashAttention-2)", norm=EAGER_NORM, rope=EAGER_ROPE, activation=EAGER_ACT,
            loss=EAGER_LOSS, attention="fa2", fp8_recipe="current", cpu_launch_s=8 * US, sequence_parallel=False,
            eager_loss=True, ddp_grad_passes=3, attn_merge=EAGER_CP_MERGE, torch_cp=True, fsdp_flat_grads=True,
            torch_fsdp=True),
    )
}

DEFAULT_STACK = "megatron-te"


def get_stack(name: str, path: str = "train.stack") -> SoftwareStack:
    """The stack registered as ``name``; ConfigError at ``path`` listing the valid names otherwise."""
    stack = STACKS.get(str(name).strip().lower())
    if stack is None:
        raise ConfigError(problem(path, name, f"known stacks: {', '.join(STACKS)}"))
    return stack


# (pattern on the lower-cased framework text, stack name); first match wins.
_FRAMEWORK_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"torchtitan.*(compile)", "torchtitan-compile"),
    (r"torchtitan", "torchtitan-eager"),
    (r"composer|llm-foundry|mosaic", "composer-fsdp"),
    (r"deepspeed", "deepspeed"),
    (r"megatron-lm \((20(19|20|21|22))\)|megatron-lm 20(19|20|21|22)", "megatron-legacy"),
    (r"^(?!.*(nemo|bridge)).*(megatron-core|megatron-lm|mcore)", "megatron-core"),
    (r"nemo|megatron|mcore|transformer engine|\bte\b", "megatron-te"),
    (r"fsdp|pytorch|torch|ddp|metaseq", "pytorch-eager"),
)


def stack_from_text(text: str | None, version: str | None = None) -> tuple[SoftwareStack, str | None]:
    """The stack a free-text ``framework`` cell names, and an assumption when it had to guess.

    ``version`` is free text that may date the framework (a row's ``source``): torchtitan with
    torch.compile dated 2024 is ``torchtitan-compile-2024`` (its loss was not compiled yet).
    Returns the matching stack and None, or the default stack and the assumption made.
    """
    raw = (text or "").strip()
    low = raw.lower()
    if low:
        for pattern, name in _FRAMEWORK_PATTERNS:
            if re.search(pattern, low):
                if name == "torchtitan-compile" and re.search(r"\b2024|2024\d\d", (version or "").lower()):
                    return STACKS["torchtitan-compile-2024"], None
                stack = STACKS[name]
                if name == "torchtitan-eager" and "eager" not in low:
                    return stack, f"framework {raw!r}: torchtitan without torch.compile assumed eager"
                return stack, None
    default = STACKS[DEFAULT_STACK]
    what = f"framework {raw!r} has no profile" if low else "framework not given"
    return default, f"{what}: default stack {DEFAULT_STACK} ({default.description.split(' (')[0]})"
