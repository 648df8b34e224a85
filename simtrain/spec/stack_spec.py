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
et al. 2024, FA3 paper Fig. 5; reference Table D). GPU profiles hold the rate of their fused kernel (cuDNN
from Hopper on, FA2 before) at a reference shape; ``simtrain.cost.attention_rates`` scales it to the
stack's kernel, key length, mask and head dim.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel

from simtrain.spec.stack_groups import (  # noqa: F401  (re-exported: the groups are part of the stack's API)
    _SPEC,
    FUSED,
    AttentionSpec,
    DataParallelSpec,
    Fp8Spec,
    FsdpSpec,
    FusionSpec,
    LaunchSpec,
    MoeSpec,
    OpFusion,
    P2PSync,
    PipelineSpec,
    RowDefaults,
    TensorParallelSpec,
)

US = 1e-6


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
    moe: MoeSpec = MoeSpec()
    """Expert-parallel token dispatch."""
    launch: LaunchSpec = LaunchSpec()
    """Host launch cost."""
    defaults: RowDefaults = RowDefaults()
    """What a published row inherits where it does not say (a run config states these itself)."""

    def fusion_of(self, kernel_name: str) -> OpFusion:
        """The fusion of the memory-bound op a kernel name belongs to (names as ``simtrain.lower.blocks`` emits).
        A routed or shared expert's activation (``expert.act``, ``shared.act``) is the dense MLP's op on the
        expert's rows (torchtitan's ``GroupedExperts``: ``F.silu(x @ w1) * (x @ w3)``, eager or compiled as the
        blocks are; Megatron-core's ``TEGroupedMLP``: its ``bias_swiglu_impl``), so it takes ``fusion.activation``."""
        parts = kernel_name.split(".")
        base = parts[1] if parts[0] in ("expert", "shared") and len(parts) > 1 else parts[0]
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
    def attention(self) -> Literal["cudnn", "fa3", "fa2", "unfused"]:
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
    def synchronous_p2p(self) -> P2PSync:
        """``pipeline.synchronous_p2p``."""
        return self.pipeline.synchronous_p2p

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
    def ddp_first_bucket_MiB(self) -> float | None:
        """``dp.first_bucket_MiB``."""
        return self.dp.first_bucket_MiB

    @property
    def megatron_buckets(self) -> bool:
        """``dp.megatron_buckets``."""
        return self.dp.megatron_buckets

    @property
    def megatron_bucket_params(self) -> int | None:
        """``dp.megatron_bucket_params``."""
        return self.dp.megatron_bucket_params

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

    @property
    def moe_probs_all_to_all(self) -> bool:
        """``moe.probs_all_to_all``."""
        return self.moe.probs_all_to_all


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
    "synchronous_p2p": ("pipeline", "synchronous_p2p"),
    "zero_stage": ("defaults", "zero_stage"), "zero1_grad_all_reduce": ("dp", "zero1_grad_all_reduce"),
    "moe_probs_all_to_all": ("moe", "probs_all_to_all"),
    "grad_dtype": ("dp", "grad_dtype"), "ddp_grad_passes": ("dp", "grad_passes"),
    "foreach_optimizer": ("dp", "foreach_optimizer"), "megatron_buckets": ("dp", "megatron_buckets"),
    "megatron_bucket_params": ("dp", "megatron_bucket_params"), "ddp_first_bucket_MiB": ("dp", "first_bucket_MiB"),
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
