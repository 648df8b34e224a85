"""The software stack's groups by concern (fusion, attention, FP8, TP, FSDP, pipeline, DP, row defaults, host
launch): frozen pydantic models, each field documented with its source. ``simtrain.spec.stack_spec`` composes
them into ``SoftwareStack``; see its docstring for how each concern is costed.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    kernel: Literal["cudnn", "fa3", "fa2", "unfused"] = "cudnn"
    """``cudnn`` (cuDNN's fused attention: Transformer Engine's ``FusedAttention``, which TE prefers over
    flash-attn on Hopper and later; FlashAttention-2 before Hopper), ``fa3`` (FlashAttention-3 itself, on
    GPUs with FP8 tensor cores), ``fa2`` (FlashAttention-2 / PyTorch SDPA's flash backend), or ``unfused``
    (Megatron's fused-softmax core attention, scores materialised). The fused kernels' rates by key length,
    mask and head dim are the FA3 paper's (Shah et al. 2024, Figs. 5-6; ``simtrain.cost.attention_rates``)."""
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


class P2PSync(StrEnum):
    """Which pipeline schedules exchange activations and gradients synchronously (``PipelineSpec.synchronous_p2p``)."""

    NONE = "none"
    """No schedule: sends run beside the compute that follows them (torch pipelining, Megatron's interleaved
    schedule with ``overlap_p2p_comm``)."""
    ONE_CHUNK = "one_chunk"
    """Schedules with one model chunk per stage (Megatron-core's non-interleaved 1F1B, which turns
    ``overlap_p2p_comm`` off, so ``batch_p2p_comm`` is on)."""
    ALL = "all"
    """Every schedule (Megatron-LM before ``batch_p2p_sync`` became a switch: the synchronize was unconditional)."""


class PipelineSpec(BaseModel):
    """The pipeline runtime: torch pipelining, synchronous exchanges, blocking DP steps, FP32 accumulation."""

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
    synchronous_p2p: P2PSync = P2PSync.NONE
    """Schedules whose pipeline exchanges are synchronous: each batched send/receive is waited on by the
    compute stream and then by the CPU. Megatron-core's ``_communicate`` runs ``req.wait()`` on every request
    (``wait_on_reqs``, the default of the non-interleaved schedule's calls) and then ``torch.cuda.synchronize()``
    when ``batch_p2p_comm and batch_p2p_sync`` (both default True; ``batch_p2p_comm = not overlap_p2p_comm``,
    and Megatron-LM's ``validate_args`` turns ``overlap_p2p_comm`` off without an interleaved schedule;
    megatron/core/pipeline_parallel/p2p_communication.py). So the compute after a send waits for the send,
    and the CPU loses its run-ahead at every send and receive (``simtrain.cost.host``)."""
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
    megatron_buckets: bool = False
    """Megatron-core DDP's bucketing where the layout sets no ``grad_bucket_MiB``: ``max(40M, 1M x dp)``
    parameters per gradient (and ZeRO-1 parameter all-gather) bucket on the first pipeline stage's first
    model chunk, one bucket for each later stage and chunk (megatron/core/distributed/
    distributed_data_parallel.py: ``bucket_size = max(40000000, 1000000 * dp_size)``, "larger DP sizes need
    larger buckets"; "Turn off bucketing if we are on a pipeline stage that is not the first ... or for
    model chunks after the first in the interleaved schedule": ``if pp_rank > 0 or disable_bucketing:
    self.bucket_size = None``, Megatron-LM ``get_model`` passing ``disable_bucketing=(model_chunk_idx > 0)``)
    [src]. Off: ``simtrain.spec.config.DEFAULT_BUCKET_MiB`` everywhere."""
    first_bucket_MiB: float | None = Field(None, gt=0, le=1e6)
    """PyTorch DDP's smaller first gradient bucket, MiB: the reducer closes the first bucket of a step
    (gradients in backward order, so the LM head's and the last layers') once it holds this much, so
    its all-reduce starts early in the backward; later buckets take the bucket size
    (``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB, passed with ``bucket_cap_mb`` to
    ``_compute_bucket_assignment_by_size`` in torch/nn/parallel/distributed.py; in torch 2.13 only where
    ``bucket_cap_mb`` is left at its default) [src]. Measured on a CPU (``benchmarks/ddp_buckets.py``): the LM
    head's 4.2 MB of gradients in a bucket of their own, all-reduced beside the layers' backward. None:
    every bucket the same size. DDP only (ZeRO-0): ZeRO-1/2 and FSDP shard their own way."""
    megatron_bucket_params: int | None = Field(None, gt=0, le=10**13)
    """With ``megatron_buckets``: parameters per bucket on the first stage's first chunk as Megatron-LM's
    ``--ddp-bucket-size`` sets them (``DistributedDataParallelConfig.bucket_size``); later stages and chunks
    still keep one bucket. None: Megatron's default, ``max(40M, 1M x dp)``."""
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


class MoeSpec(BaseModel):
    """Expert-parallel token dispatch."""

    model_config = _SPEC
    probs_all_to_all: bool = False
    """The all-to-all dispatcher sends each routed copy's probability after its tokens, in a second EP
    all-to-all (fp32, one value per copy), and its gradient back in backward: Megatron-core 0.13 and later
    apply the probabilities in the experts' activation ("Memory efficient token permutation by moving the
    probs multiplication from unpermutation to activation function of GroupedMLP", MCore v0.13 release
    notes; ``MoEAlltoAllTokenDispatcher.token_dispatch``: ``global_probs = all_to_all(self.ep_group,
    permuted_probs, ...)``). False: the probabilities stay on the sending rank and weigh the outputs at the
    unpermutation (Megatron-core before 0.13, torchtitan). DeepEP's dispatch carries them in its own kernel."""


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
