"""The software stack as a spec: what the training framework changes about the cost of the same model
and layout, split by concern.

The same layout runs at different speeds under Megatron-Core with Transformer Engine, torchtitan
(FSDP2, eager or ``torch.compile``), MosaicML Composer (FSDP) or DeepSpeed, because the frameworks
differ in things a user chooses: whether memory-bound ops are fused, which attention kernel runs,
how FP8 scales its tensors, which overlap features are on, and how much CPU time each kernel launch
costs. A :class:`SoftwareStack` holds those choices as documented fields, grouped by concern
(``fusion``, ``attn``, ``fp8``, ``tp``, ``fsdp``, ``pipeline``, ``dp``, ``launch``, and ``defaults``:
what a published row inherits where it does not say); each field also has a flat name (``FLAT_FIELDS``:
``dtensor_tp`` is ``tp.dtensor``), readable as an attribute and accepted in overrides. The named stacks
are presets (``simtrain.spec.stacks``); ``train.stack`` names one or overrides its fields
(``simtrain.spec.stacks.StackOverride``).

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
  Megatron-LM before Megatron-Core (``megatron/model/gpt_model.py``: ``vocab_parallel_cross_entropy(
  output.float(), labels)``; Megatron-DeepSpeed the same) runs these same ops.
- Megatron-core's "fused" cross-entropy (``--cross-entropy-loss-fusion`` with the default
  ``--cross-entropy-fusion-impl native``, which NeMo and Megatron-Bridge recipes set;
  megatron/core/fusions/fused_cross_entropy.py) ``jit_fuser``-compiles the same steps in a few regions,
  each still a pass over the fp32 logits: upcast with the max (2+4), exp of the shifted logits in place
  (4+4), their row sum (4), divide in place to the saved softmax (4+4); backward scales the softmax in place
  (4+4) and casts it to BF16 (4+2): 40 bytes/elem vs 16, 2.5x, ~5 kernels per direction (forward:
  max, predicted-logit gather, exp, sum, divide; backward: scatter, scale, cast). Its 2024-2025 form
  compiled sub/exp/sum and the backward (with its cast) as one region each (>= 32 bytes/elem), but
  Inductor copies an in-place-mutated input back through a fresh logits-sized buffer when the region also
  reduces or scatters over it (the file's note: "an extra read/write pass", +8 each: <= 48); 40 is the
  current file's count and the middle of that range.
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
The CPU runs ahead of the GPU; it stalls the GPU where its cumulative issue time overtakes the
GPU's busy time and after each host synchronisation (``simtrain.cost.host``).

Attention kernels on Hopper: FlashAttention-2 (PyTorch SDPA's flash backend, flash-attn 2) reaches
~309-370 TFLOP/s forward at head dim 128 (31-37 % of the H100 dense peak), FlashAttention-3 and
cuDNN's fused attention (Transformer Engine's default on Hopper) ~467-648 TFLOP/s (47-65 %) (Shah
et al. 2024, FA3 paper Fig. 5; reference Table D). On Ampere FA2 is the best kernel; GPU profiles
hold the best kernel's efficiency, and ``fa2`` scales it on Hopper and later by ``FA2_ON_HOPPER``.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

US = 1e-6

#: FA2 / FA3 forward throughput on H100 at head dim 128: midpoints 340 / 558 TFLOP/s (FA3 paper Fig. 5,
#: reference Table D) = 0.61. Applied to GPUs with FA3-class kernels (Hopper, Blackwell) only.
FA2_ON_HOPPER = 0.61

# use_attribute_docstrings: each field's docstring is its description (simtrain schema, errors).
_SPEC = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)


class OpFusion(BaseModel):
    """How one kind of memory-bound op runs: HBM traffic relative to one fused pass, kernels launched."""

    model_config = _SPEC
    bytes_factor: float = Field(1.0, gt=0)
    """HBM bytes the op moves, as a multiple of one fused kernel that reads its inputs and writes its output
    once (module docstring: eager RMSNorm ~9, RoPE 5, SwiGLU 1.7, cross-entropy 1.8)."""
    kernels: int = Field(1, ge=1, le=1000)
    """Kernels launched for the op; each costs the stack's ``launch.cpu_launch_s`` of CPU issue time."""

    @field_validator("kernels", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        return _refuse_bool(value)


def _refuse_bool(value: object) -> object:
    """A count never reads YAML's ``true`` as 1 (``simtrain.spec.batch.whole_number`` does the same for config counts)."""
    if isinstance(value, bool):
        raise ValueError("a yes/no value is not a count; give a whole number")
    return value


FUSED = OpFusion()


class FusionSpec(BaseModel):
    """Fusion of the memory-bound ops, forward and backward (factors derived in the module docstring)."""

    model_config = _SPEC
    norm: OpFusion = FUSED
    """LayerNorm/RMSNorm (kernel names ``ln*``, ``norm*``, ``final_norm``)."""
    rope: OpFusion = FUSED
    """Rotary position embedding of q and k (``rope*``)."""
    activation: OpFusion = FUSED
    """MLP activation: SwiGLU's ``silu(w1 x) * w3 x``, GELU with its bias (``act*``)."""
    residual: OpFusion = FUSED
    """Residual add (``residual*``): one kernel either way."""
    loss: OpFusion = FUSED
    """Cross-entropy over the vocabulary (``cross_entropy*``): fused vocab-parallel kernel, Megatron-core's
    unfused one (``--cross-entropy-loss-fusion`` off) or eager ``F.cross_entropy``."""
    attn_merge: OpFusion = FUSED
    """The ring-attention merge of each context-parallel step (``cp_merge*``): Transformer Engine fuses it
    (``flash_attn_fwd_out_correction``), torch's ring attention runs eager ops (``_SDPAMerger.step``)."""
    eager_loss: bool = False
    """The cross-entropy runs in eager PyTorch on an fp32 copy of the logits
    (``F.cross_entropy(logits.float(), labels)``), whose backward holds two fp32 logit-sized gradients beside
    the saved log-softmax (``memory.loss_backward_transient_bytes``)."""
    compiled_blocks: bool = False
    """The transformer blocks run under ``torch.compile``: AOTAutograd's min-cut partitioner saves for
    backward only the tensors its backward graph reads, so op-level SAC does not keep the outputs its
    policy marks MUST_SAVE that nothing in the backward reads (the row-parallel projections feeding the
    residual add; ``memory.op_sac_activation_bytes``); eager SAC caches them all until the recompute."""


class AttentionSpec(BaseModel):
    """The attention kernel and the context-parallel ring."""

    model_config = _SPEC
    kernel: Literal["fa3", "fa2", "unfused"] = "fa3"
    """``fa3`` (FlashAttention-3 / cuDNN fused attention, Transformer Engine's default on Hopper), ``fa2``
    (FlashAttention-2 / PyTorch SDPA's flash backend: ``FA2_ON_HOPPER`` of the profile's attention
    efficiency on Hopper and later; Shah et al. 2024 Fig. 5), or ``unfused`` (Megatron's fused-softmax core
    attention, scores materialised)."""
    torch_ring: bool = False
    """Context parallelism through torch's ring attention (``context_parallel``; ``BlockBuilder.torch_cp``)
    rather than Transformer Engine's KV ring."""


class Fp8Spec(BaseModel):
    """FP8 policy: weight cache, FP8 tensor-parallel gathers."""

    model_config = _SPEC
    weight_cache: bool = False
    """FP8 weights are quantised once per step and reused by the step's other micro-batches (Transformer
    Engine's ``is_first_microbatch``: ``update_fp8_weights = is_first_microbatch is None or
    is_first_microbatch`` in ``te.pytorch.module.linear._Linear.forward``; Megatron-core's TE layers pass
    it unless ``disable_parameter_transpose_cache``). False: a per-tensor current-scaling forward
    re-quantises its weight every time (torchao ``Float8Linear``)."""
    tp_gather: bool = False
    """Tensorwise FP8 casts a column-parallel layer's input on its sequence shard and all-gathers it in
    FP8 (``BlockBuilder.fp8_tp_gather``; torchao Float8ColwiseParallel, the torchtitan default)."""
    expert_padding_copies: bool = False
    """FP8 MoE on Transformer Engine copies each local expert's rows into a buffer padded to the FP8 GEMM's
    row alignment and back out (Megatron-core ``TEGroupedMLP`` with ``Fp8Padding``/``Fp8Unpadding``) unless the
    router already pads the routing map (``moe_router_padding_for_fp8``, Megatron-core ``TransformerConfig``).
    False in every preset: Megatron-Bridge's MoE performance recipes set that router padding
    (``cfg.model.moe_router_padding_for_fp8 = True``), and which other recipes set it is not known per run;
    True charges the copies (``lower.blocks.moe``) for runs known to leave it off."""


class TensorParallelSpec(BaseModel):
    """Tensor parallelism: DTensor or Megatron layers, the input-gradient all-reduce."""

    model_config = _SPEC
    dtensor: bool = False
    """Tensor parallelism through DTensor with separate q/k/v and gate/up linears (``BlockBuilder.dtensor_tp``):
    sequence parallelism shards the sequence dim of [batch, seq, hidden] (Shard(1)), so each unfused TP
    all-gather / reduce-scatter pays a full-tensor copy, and async TP cannot fuse the backward
    reduce-scatters of summed input gradients. Megatron-core keeps [seq, batch, hidden], gathers along
    dim 0 in place and fuses QKV and FC1 into one GEMM each."""
    async_grad_allreduce: bool = False
    """Without sequence parallelism, TP's column-parallel layers all-reduce their input gradient beside
    their weight-gradient GEMM (Megatron-LM >= v2.6 ``async_grad_allreduce``, on unless
    ``--no-async-tensor-model-parallel-allreduce``; Transformer Engine's linears): ``BlockBuilder.
    tp_async_grad_allreduce``. False: after the layer's backward, blocking (BigScience's Megatron-DeepSpeed
    ``copy_to_tensor_model_parallel_region``; DTensor)."""


class FsdpSpec(BaseModel):
    """ZeRO-3 / FSDP behaviour: resharding under PP, FSDP2 copies, FSDP1 flat gradients, master shards."""

    model_config = _SPEC
    reshard_under_pp: bool = True
    """ZeRO-3/FSDP with pipeline parallelism re-gathers each layer's parameters for every micro-batch
    (True), or keeps a stage's parameters unsharded from the first forward to the end of the step and
    reduce-scatters its accumulated gradients once, after the stage's last backward (False):
    torchtitan's ``apply_fsdp`` passes ``reshard_after_forward=not pp_enabled`` ("do not reshard after
    forward to avoid per-microbatch all-gathers"), and ``torch.distributed.pipelining``'s
    ``PipelineStage.backward_maybe_with_nosync`` sets ``set_reshard_after_backward(False)`` and
    ``set_requires_gradient_sync(False)`` until the last backward, then runs FSDP's post-backward."""
    param_copies: bool = False
    """FSDP2's per-parameter sharding copies: each all-gather is followed by a copy-out of the flat
    output into the unsharded parameters (``foreach_all_gather_copy_out``: read and write 2 bytes per
    parameter), and each reduce-scatter is preceded by a copy-in of the unsharded gradients into the
    flat input, cast to the reduce dtype (``foreach_reduce``'s ``_chunk_cat``: read 2, write the
    gradient bytes) (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). FSDP1 and ZeRO gather
    into flat buffers the parameters are views of, without a copy-out; FSDP1's gradient side is
    ``flat_grads``."""
    flat_grads: bool = False
    """FSDP1's FlatParameter gradient path before each reduce-scatter (``stack_rules.fsdp1_grad_bytes``):
    autograd builds a unit's flat gradient by concatenating its parameters' gradients (the parameters are
    views split from the flat parameter, torch/distributed/fsdp/_flat_param.py ``_get_unflat_views``, whose
    backward ``split_with_sizes_backward`` is a ``cat``: read and write 2 B per parameter), casts it to a
    reduce dtype other than the parameter dtype (``_post_backward_hook``), and divides it in place by the
    gradient pre-divide factor (``_reduce_grad``: ``_div_if_needed(padded_unsharded_grad,
    _gradient_predivide_factor)``, a factor > 1 for any sharding group > 1; torch/distributed/fsdp/
    _runtime_utils.py). FSDP2 copies instead (``param_copies``) and lets NCCL average fp32/bf16."""
    pytorch: bool = False
    """ZeRO-3 is PyTorch FSDP (FSDP1 or FSDP2) under a mixed-precision policy (``memory.static_memory``):
    the sharded parameter stays in fp32 and is the optimizer's master weight, so no bf16 shard is kept
    beside it (the bf16 copy exists only unsharded, gathered; FSDP2 ``MixedPrecisionPolicy`` casts in
    ``FSDPParam.init_all_gather_outputs``; FSDP1 frees its ``_mp_shard`` after each all-gather), and the
    root unit, the parameters outside the wrapped blocks (embedding, final norm, LM head), is never
    resharded after forward: its gathered bf16 parameters live from the forward's start to the end of
    the backward (FSDP2 ``FSDPState._lazy_init`` sets the root group's ``post_forward_mesh_info = None``;
    FSDP1 ``_post_forward_reshard`` skips the root handle). DeepSpeed ZeRO-3 keeps a bf16 partition
    beside its fp32 master partition (False)."""


class PipelineSpec(BaseModel):
    """The pipeline runtime: torch pipelining, blocking DP steps, FP32 accumulation."""

    model_config = _SPEC
    torch_pipelining: bool = False
    """Pipeline parallelism through ``torch.distributed.pipelining``, whose stages keep per-micro-batch
    receive buffers and the last stage's outputs for the whole step
    (``memory.pipeline_stage_buffer_bytes``)."""
    dp_overlap: bool = True
    """Under pipeline parallelism the data-parallel gradient reduction and the ZeRO-1/2 parameter
    all-gather overlap compute as the layout's ``overlap_grad_reduce`` / ``overlap_param_gather`` ask
    (Megatron-core). False: the framework runs them as blocking steps of its schedule, the reduction
    after the pipeline flush and the gather after the optimizer step (DeepSpeed ``PipelineEngine``:
    ``ReduceGrads`` then ``OptimizerStep`` instructions; ``stack_rules.dp_overlaps``)."""
    fp32_grad_accumulation_pass: bool = False
    """Under pipeline parallelism each micro-batch's BF16 gradients are added into FP32 copies by a
    separate pass after its backward, before the gradient is sent upstream (DeepSpeed ``PipelineEngine.
    _exec_backward_pass`` with the BF16 optimizer: ``optimizer.update_hp_grads(clear_lp_grads=False)``,
    per parameter ``hp_grad.add_(lp.grad.to(float32))``: 18 bytes per parameter through HBM;
    ``stack_rules.FP32_GRAD_ACCUMULATION_BYTES_PER_PARAM``). Megatron-core accumulates into its FP32
    ``main_grad`` inside the weight-gradient GEMM (gradient-accumulation fusion): no pass."""


class DataParallelSpec(BaseModel):
    """Data parallelism and the optimizer: gradient dtype and collective, DDP passes, AdamW."""

    model_config = _SPEC
    zero1_grad_all_reduce: bool = False
    """Under pipeline parallelism ZeRO-1 all-reduces the accumulated gradients instead of
    reduce-scattering them; each rank then steps its optimizer shard and all-gathers the updated bf16
    parameters (DeepSpeed's BF16_Optimizer under its pipeline engine: ``PipelineEngine._bf16_reduce_grads``
    runs ``buffered_allreduce_fallback`` on the fp32 ``get_grads_for_reduction()``)."""
    grad_dtype: Literal["fp32", "bf16"] = "fp32"
    """Gradient buffer and data-parallel reduction dtype when a run does not set ``train.grad_dtype``.
    Megatron-LM accumulates into fp32 ``main_grad`` for bf16 training unless ``--grad-reduce-in-bf16``;
    NeMo's performance configs pass ``optim.grad_sync_dtype=bf16`` (NeMo-Framework-Launcher
    examples/training/*/h100/*.sh, conf/training/nemotron/nemotron_340b.yaml), which NeMo maps to
    ``DistributedDataParallelConfig(grad_reduce_in_fp32=False)`` (megatron_gpt_model.py
    ``setup_mcore_distributed_parallel``), and Megatron-Bridge's performance recipes set
    ``cfg.ddp.grad_reduce_in_fp32 = False`` (scripts/performance/configs/*): a bf16 buffer."""
    grad_passes: int = Field(1, ge=0, le=100)
    """Passes over a DDP bucket's gradients besides the all-reduce (each reads and writes them):
    Megatron-core DDP accumulates into the contiguous bucket and only scales it (1); PyTorch DDP's
    reducer copies each grad into the flat bucket, divides it by the world size and copies it back
    (3; torch/csrc/distributed/c10d/reducer.cpp, without gradient_as_bucket_view)."""
    foreach_optimizer: bool = False
    """The optimizer step runs PyTorch's multi-tensor (``foreach``) AdamW and ``clip_grad_norm_(foreach=True)``
    instead of one fused kernel (torchtitan's default: ``"fused": fused, "foreach": not fused`` with
    ``--optimizer.fused`` off; ``stack_rules.optimizer_bytes_per_param``)."""

    @field_validator("grad_passes", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        return _refuse_bool(value)


class RowDefaults(BaseModel):
    """What a published run inherits from its framework where its row does not say (``simtrain validate``,
    ``simtrain.validation.csv_runs``). A run config states each of these itself (``ROW_DEFAULT_FIELDS``: layout and
    train fields), so ``train.stack`` does not override them."""

    model_config = _SPEC
    fp8_recipe: Literal["delayed", "current", "blockwise"] = "delayed"
    """FP8 scaling when a row asks for fp8 without naming one (the quantisation traffic of each recipe is
    ``simtrain.cost.costs.FP8_CAST_BYTES``)."""
    tp_comm_overlap: bool = False
    """TP communication overlapped with GEMMs (Megatron userbuffers / torchtitan async TP)."""
    sequence_parallel: bool = True
    """Sequence parallelism on whenever tp > 1 (Megatron-DeepSpeed: opt-in, ``--sequence-parallel``)."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """ZeRO stage (Megatron distributed optimizer = 1)."""
    pp_microbatches_equal_pp: bool = False
    """The framework splits a local batch into ``pp`` micro-batches (torchtitan
    ``pipeline_parallel_microbatches``) instead of taking a micro-batch size."""

    @field_validator("zero_stage", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        return _refuse_bool(value)


class LaunchSpec(BaseModel):
    """Host-side cost of launching kernels."""

    model_config = _SPEC
    cpu_launch_s: float = Field(0.0, ge=0.0, le=1.0)
    """CPU time to issue one kernel, seconds (0 = launches never stall the GPU). Eager PyTorch spends
    ~5-10 us of CPU per op when CPU-bound (reference hardware-collectives-memory.md sec. 3 "Isolation vs in
    situ"); FSDP2's per-parameter hooks add to it; Inductor-compiled regions launch far less. The CPU runs
    ahead of the GPU, so it stalls the GPU only where its cumulative issue time overtakes the GPU's busy
    time, or after a host sync (``simtrain.cost.host``); x ``GRACE_HOST_FACTOR`` on Grace-hosted GPUs."""
    cuda_graphs: bool = False
    """The blocks run as captured CUDA graphs (Megatron ``cuda_graph_impl`` "local" or "transformer_engine"
    with a ``cuda_graph_scope``, TE ``make_graphed_callables``; NVIDIA Megatron-Bridge docs "CUDA Graphs":
    replayed "with minimal host overhead"): the kernels cost no CPU issue time; host syncs remain. Off in
    every preset (Megatron-Bridge's ``cuda_graph_impl`` defaults to "none"; recipes turn it on per model)."""
    moe_token_count_sync: bool = True
    """Dropless MoE copies the tokens-per-expert counts to the host once per MoE layer's forward and waits
    for them (the all-to-all's split sizes are host lists): Megatron-core ``MoEAlltoAllTokenDispatcher``
    (``cuda_sync_point`` "before_ep_alltoall"/"before_finish", megatron/core/transformer/moe/
    token_dispatcher.py) and torchtitan's expert parallelism (``torch.cuda.current_stream().synchronize()``
    before ``all_to_all_single``, "this would incur a device-to-host sync"). False: a fixed, padded capacity."""
    grouped_gemm_per_expert: bool = False
    """The MoE experts' grouped GEMM is one GEMM launch per local expert: Transformer Engine's
    ``GroupedLinear`` (Megatron-core ``TEGroupedMLP``) runs ``general_grouped_gemm`` as
    ``nvte_multi_stream_cublas_gemm``, a cuBLAS GEMM per expert over several streams, with per-expert host
    work around it (``torch.split``, 2 ``torch.empty`` per GEMM: NVIDIA/TransformerEngine#1499). False: one
    kernel for all experts (torch ``_grouped_mm``, as torchtitan)."""
    loss_check_sync: bool = False
    """Each micro-batch's loss is checked for NaN/Inf on the host before its backward: Megatron's
    ``loss_func`` calls ``rerun_state_machine.validate_result(result=loss, rejection_func=torch.isnan)``
    under ``check_for_nan_in_loss_and_grad`` (on unless ``--no-check-for-nan-in-loss-and-grad``;
    Megatron-LM pretrain_gpt.py; Megatron-Bridge's CUDA-graph guide turns its
    ``rerun_state_machine.check_for_nan_in_loss`` off because the check syncs)."""
    grad_norm_sync: bool = False
    """The optimizer step reads the gradient norm on the host before updating (Megatron-core
    ``get_grad_norm_fp32``: ``total_norm.item()``, megatron/core/optimizer/clip_grads.py); torch's
    ``clip_grad_norm_`` keeps it on the GPU."""


class SoftwareStack(BaseModel):
    """A training framework's kernel and overlap choices, grouped by concern (module docstring).

    Every field is also readable by its flat name (``FLAT_FIELDS``), e.g. ``stack.dtensor_tp`` is
    ``stack.tp.dtensor``."""

    model_config = _SPEC
    name: str
    """Preset name (``train.stack``); an overridden stack keeps its preset's name."""
    description: str
    """What it stands for, with versions."""
    fusion: FusionSpec = FusionSpec()
    """Fusion of the memory-bound ops."""
    attn: AttentionSpec = AttentionSpec()
    """Attention kernel and context-parallel ring."""
    fp8: Fp8Spec = Fp8Spec()
    """FP8 policy."""
    tp: TensorParallelSpec = TensorParallelSpec()
    """Tensor-parallel behaviour."""
    fsdp: FsdpSpec = FsdpSpec()
    """ZeRO-3 / FSDP behaviour."""
    pipeline: PipelineSpec = PipelineSpec()
    """Pipeline runtime."""
    dp: DataParallelSpec = DataParallelSpec()
    """Data-parallel (DDP / ZeRO) and optimizer behaviour."""
    launch: LaunchSpec = LaunchSpec()
    """Host launch cost."""
    defaults: RowDefaults = RowDefaults()
    """What a published row inherits where it does not say (a run config states these itself)."""

    def fusion_of(self, kernel_name: str) -> OpFusion:
        """The fusion of the memory-bound op a kernel name belongs to (names as ``simtrain.lower.blocks`` emits)."""
        base = kernel_name.split(".")[0]
        f = self.fusion
        if base.startswith(("ln", "final_norm", "norm")):
            return f.norm
        if base.startswith("rope"):
            return f.rope
        if base.startswith("act"):
            return f.activation
        if base.startswith("residual"):
            return f.residual
        if base.startswith("cross_entropy"):
            return f.loss
        if base.startswith("cp_merge"):
            return f.attn_merge
        return FUSED

    # -- flat names (FLAT_FIELDS): the short names callers and ``--set train.stack.<name>`` use ----------
    @property
    def norm(self) -> OpFusion:
        """``fusion.norm``."""
        return self.fusion.norm

    @property
    def rope(self) -> OpFusion:
        """``fusion.rope``."""
        return self.fusion.rope

    @property
    def activation(self) -> OpFusion:
        """``fusion.activation``."""
        return self.fusion.activation

    @property
    def residual(self) -> OpFusion:
        """``fusion.residual``."""
        return self.fusion.residual

    @property
    def loss(self) -> OpFusion:
        """``fusion.loss``."""
        return self.fusion.loss

    @property
    def attn_merge(self) -> OpFusion:
        """``fusion.attn_merge``."""
        return self.fusion.attn_merge

    @property
    def eager_loss(self) -> bool:
        """``fusion.eager_loss``."""
        return self.fusion.eager_loss

    @property
    def compiled_blocks(self) -> bool:
        """``fusion.compiled_blocks``."""
        return self.fusion.compiled_blocks

    @property
    def attention(self) -> Literal["fa3", "fa2", "unfused"]:
        """``attn.kernel``."""
        return self.attn.kernel

    @property
    def torch_cp(self) -> bool:
        """``attn.torch_ring``."""
        return self.attn.torch_ring

    @property
    def fp8_recipe(self) -> Literal["delayed", "current", "blockwise"]:
        """``defaults.fp8_recipe``."""
        return self.defaults.fp8_recipe

    @property
    def fp8_weight_cache(self) -> bool:
        """``fp8.weight_cache``."""
        return self.fp8.weight_cache

    @property
    def fp8_tp_gather(self) -> bool:
        """``fp8.tp_gather``."""
        return self.fp8.tp_gather

    @property
    def fp8_expert_padding_copies(self) -> bool:
        """``fp8.expert_padding_copies``."""
        return self.fp8.expert_padding_copies

    @property
    def tp_comm_overlap(self) -> bool:
        """``defaults.tp_comm_overlap``."""
        return self.defaults.tp_comm_overlap

    @property
    def sequence_parallel(self) -> bool:
        """``defaults.sequence_parallel``."""
        return self.defaults.sequence_parallel

    @property
    def dtensor_tp(self) -> bool:
        """``tp.dtensor``."""
        return self.tp.dtensor

    @property
    def tp_async_grad_allreduce(self) -> bool:
        """``tp.async_grad_allreduce``."""
        return self.tp.async_grad_allreduce

    @property
    def fsdp_reshard_under_pp(self) -> bool:
        """``fsdp.reshard_under_pp``."""
        return self.fsdp.reshard_under_pp

    @property
    def fsdp_param_copies(self) -> bool:
        """``fsdp.param_copies``."""
        return self.fsdp.param_copies

    @property
    def fsdp_flat_grads(self) -> bool:
        """``fsdp.flat_grads``."""
        return self.fsdp.flat_grads

    @property
    def torch_fsdp(self) -> bool:
        """``fsdp.pytorch``."""
        return self.fsdp.pytorch

    @property
    def pp_microbatches_equal_pp(self) -> bool:
        """``defaults.pp_microbatches_equal_pp``."""
        return self.defaults.pp_microbatches_equal_pp

    @property
    def torch_pipelining(self) -> bool:
        """``pipeline.torch_pipelining``."""
        return self.pipeline.torch_pipelining

    @property
    def pp_dp_overlap(self) -> bool:
        """``pipeline.dp_overlap``."""
        return self.pipeline.dp_overlap

    @property
    def fp32_grad_accumulation_pass(self) -> bool:
        """``pipeline.fp32_grad_accumulation_pass``."""
        return self.pipeline.fp32_grad_accumulation_pass

    @property
    def zero_stage(self) -> Literal[0, 1, 2, 3]:
        """``defaults.zero_stage``."""
        return self.defaults.zero_stage

    @property
    def zero1_grad_all_reduce(self) -> bool:
        """``dp.zero1_grad_all_reduce``."""
        return self.dp.zero1_grad_all_reduce

    @property
    def grad_dtype(self) -> Literal["fp32", "bf16"]:
        """``dp.grad_dtype``."""
        return self.dp.grad_dtype

    @property
    def ddp_grad_passes(self) -> int:
        """``dp.grad_passes``."""
        return self.dp.grad_passes

    @property
    def foreach_optimizer(self) -> bool:
        """``dp.foreach_optimizer``."""
        return self.dp.foreach_optimizer

    @property
    def cpu_launch_s(self) -> float:
        """``launch.cpu_launch_s``."""
        return self.launch.cpu_launch_s

    @property
    def cuda_graphs(self) -> bool:
        """``launch.cuda_graphs``."""
        return self.launch.cuda_graphs

    @property
    def moe_token_count_sync(self) -> bool:
        """``launch.moe_token_count_sync``."""
        return self.launch.moe_token_count_sync

    @property
    def grouped_gemm_per_expert(self) -> bool:
        """``launch.grouped_gemm_per_expert``."""
        return self.launch.grouped_gemm_per_expert

    @property
    def loss_check_sync(self) -> bool:
        """``launch.loss_check_sync``."""
        return self.launch.loss_check_sync

    @property
    def grad_norm_sync(self) -> bool:
        """``launch.grad_norm_sync``."""
        return self.launch.grad_norm_sync


#: Each field's flat name -> (group, field): the names the stack had before it was split by concern, read as
#: attributes (``SoftwareStack.tp_comm_overlap``) and accepted in overrides (``train.stack.tp_comm_overlap``).
FLAT_FIELDS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "norm": ("fusion", "norm"), "rope": ("fusion", "rope"), "activation": ("fusion", "activation"),
    "residual": ("fusion", "residual"), "loss": ("fusion", "loss"), "attn_merge": ("fusion", "attn_merge"),
    "eager_loss": ("fusion", "eager_loss"), "compiled_blocks": ("fusion", "compiled_blocks"),
    "attention": ("attn", "kernel"), "torch_cp": ("attn", "torch_ring"),
    "fp8_recipe": ("defaults", "fp8_recipe"), "fp8_weight_cache": ("fp8", "weight_cache"), "fp8_tp_gather": ("fp8", "tp_gather"),
    "fp8_expert_padding_copies": ("fp8", "expert_padding_copies"),
    "tp_comm_overlap": ("defaults", "tp_comm_overlap"), "sequence_parallel": ("defaults", "sequence_parallel"),
    "dtensor_tp": ("tp", "dtensor"), "tp_async_grad_allreduce": ("tp", "async_grad_allreduce"),
    "fsdp_reshard_under_pp": ("fsdp", "reshard_under_pp"), "fsdp_param_copies": ("fsdp", "param_copies"),
    "fsdp_flat_grads": ("fsdp", "flat_grads"), "torch_fsdp": ("fsdp", "pytorch"),
    "pp_microbatches_equal_pp": ("defaults", "pp_microbatches_equal_pp"),
    "torch_pipelining": ("pipeline", "torch_pipelining"), "pp_dp_overlap": ("pipeline", "dp_overlap"),
    "fp32_grad_accumulation_pass": ("pipeline", "fp32_grad_accumulation_pass"),
    "zero_stage": ("defaults", "zero_stage"), "zero1_grad_all_reduce": ("dp", "zero1_grad_all_reduce"),
    "grad_dtype": ("dp", "grad_dtype"), "ddp_grad_passes": ("dp", "grad_passes"),
    "foreach_optimizer": ("dp", "foreach_optimizer"),
    "cpu_launch_s": ("launch", "cpu_launch_s"), "cuda_graphs": ("launch", "cuda_graphs"),
    "moe_token_count_sync": ("launch", "moe_token_count_sync"), "grad_norm_sync": ("launch", "grad_norm_sync"),
    "loss_check_sync": ("launch", "loss_check_sync"), "grouped_gemm_per_expert": ("launch", "grouped_gemm_per_expert"),
})  # fmt: skip

#: The run-config field that states each row default itself (``RowDefaults``; ``train.stack`` refuses them).
ROW_DEFAULT_FIELDS: Mapping[str, str] = MappingProxyType({
    "fp8_recipe": "train.fp8_recipe", "tp_comm_overlap": "layout.tp_comm_overlap",
    "sequence_parallel": "layout.sequence_parallel", "zero_stage": "layout.zero_stage",
    "pp_microbatches_equal_pp": "train.micro_batch_size"})

#: The groups a stack's fields are split into (SoftwareStack's fields besides name and description).
GROUPS: tuple[str, ...] = tuple(n for n in SoftwareStack.model_fields if n not in ("name", "description"))

# Eager PyTorch op decompositions (module docstring): RMSNorm 9x / 7 kernels, RoPE 5x / 6, SwiGLU 1.7x / 2,
# cross-entropy 1.8x / 4.
EAGER_NORM = OpFusion(bytes_factor=9.0, kernels=7)
EAGER_ROPE = OpFusion(bytes_factor=5.0, kernels=6)
EAGER_ACT = OpFusion(bytes_factor=1.7, kernels=2)
EAGER_LOSS = OpFusion(bytes_factor=1.8, kernels=4)
# torch ring attention's eager merge of each CP step (module docstring): 34 / 10 bytes per element, 5 kernels.
EAGER_CP_MERGE = OpFusion(bytes_factor=3.4, kernels=5)
# Megatron-core's unfused vocab-parallel cross-entropy (module docstring): 52 / 16 bytes per element, 7 kernels.
MEGATRON_UNFUSED_LOSS = OpFusion(bytes_factor=3.25, kernels=7)
# Megatron-core's jit-fused cross-entropy (native impl; module docstring): 40 / 16 bytes per element, 5 kernels.
MEGATRON_FUSED_LOSS = OpFusion(bytes_factor=2.5, kernels=5)
# TorchInductor: one fused Triton kernel per chain, two for reductions (norm, loss) (PyTorch 2 paper sec. 5).
COMPILED_REDUCTION = OpFusion(bytes_factor=1.0, kernels=2)
