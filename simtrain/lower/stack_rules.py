"""Stack rules: what a software stack's fields mean for a layout, as the lowering and the search estimate ask.

Predicates and per-parameter costs that combine a :class:`simtrain.spec.stack_spec.SoftwareStack` with a layout
and a batch: which data-parallel collectives overlap, which gradient collective runs, whether FSDP keeps a
pipeline stage unsharded, the optimizer's and FSDP1's HBM bytes per parameter, the FP8 amax all-reduces,
and the per-micro-batch FP32 gradient accumulation pass. Lowering (``simtrain.lower.lowering``) and the search
estimate (``simtrain.studies.estimate``) both call these, so the two charge the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from simtrain.lower.blocks import AMAX_CASTS_TE, AMAX_CASTS_TORCHAO
from simtrain.lower.kernels import MemoryBound
from simtrain.spec.collective_kinds import ALL_REDUCE, REDUCE_SCATTER, Collective
from simtrain.spec.config import DEFAULT_BUCKET_MiB, LayoutConfig, TrainConfig
from simtrain.spec.stack_spec import P2PSync, SoftwareStack
from simtrain.spec.units import MiB

# DeepSpeed BF16_Optimizer.update_hp_grads: hp_grad.add_(lp.grad.to(float32)) reads the BF16 gradient (2 B)
# and writes its FP32 copy (4 B), then add_ reads both FP32 tensors and writes one (12 B)
FP32_GRAD_ACCUMULATION_BYTES_PER_PARAM = 18.0
# FSDP2 without gradient sync (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
# ``accumulate_unsharded_grad_if_needed``: ``unsharded_accumulated_grad += unsharded_param.grad``) reads the
# FP32 accumulator (4 B) and the BF16 gradient (2 B) and writes the accumulator (4 B). The first micro-batch's
# ``to_accumulated_grad_if_needed`` upcast moves 6 B instead; counted as 10 B too (<= 4 B per parameter per step).
FSDP2_UNSHARDED_ACCUMULATION_BYTES_PER_PARAM = 10.0



def optimizer_bytes_per_param(train: TrainConfig, stack: SoftwareStack) -> float:
    """HBM bytes the optimizer step moves per parameter of this rank's shard (G = gradient bytes).

    Fused Adam (Apex / Transformer Engine / ``fused=True``) reads the gradient, fp32 master, m and v and
    writes master, m, v and the bf16 weights: G + 4+4+4 + 4+4+4+2 = G + 26; SGD with momentum drops v
    (G + 18). PyTorch's foreach AdamW (``SoftwareStack.foreach_optimizer``; torch/optim/adamw.py
    ``_multi_tensor_adamw``, non-capturable) runs one pass per operation: weight decay ``mul_`` on the
    master (8), ``lerp_`` of m toward the gradient (8 + G), ``mul_`` and ``addcmul_`` of v (8, 8 + G), sqrt of
    v into a temporary (8), its ``div_`` and ``add_`` (8, 8), ``addcdiv_`` into the master (16): 72 + 2G,
    and ``clip_grad_norm_(foreach=True)`` reads every gradient for the norm and scales it in place (3G); the
    bf16 weights (2) as fused.
    """
    grad_b = train.grad_bytes
    if train.optimizer == "sgd":
        return grad_b + 16.0 + 2.0
    if stack.foreach_optimizer:
        return 72.0 + 5.0 * grad_b + 2.0
    return grad_b + 24.0 + 2.0


def fsdp1_grad_bytes(grad_bytes: float) -> float:
    """HBM bytes per parameter FSDP1 moves to build a unit's flat gradient before its reduce-scatter
    (``SoftwareStack.fsdp_flat_grads``): the bf16 ``cat`` (2 + 2), a cast to a wider reduce dtype
    (2 + ``grad_bytes``, only when it is not bf16) and the in-place pre-divide (2 x ``grad_bytes``)."""
    cast = 0.0 if grad_bytes == 2.0 else 2.0 + grad_bytes
    return 4.0 + cast + 2.0 * grad_bytes


#: Megatron-core DDP's default bucket, parameters: ``max(MEGATRON_BUCKET_MIN_PARAMS,
#: MEGATRON_BUCKET_PARAMS_PER_DP_RANK * dp)`` (``DistributedDataParallelConfig.bucket_size``: "MCore uses a
#: default value of max(40000000, 1000000 * dp_size) parameters (larger DP sizes need larger buckets to
#: ensure collectives do not become latency-bound)") [src].
MEGATRON_BUCKET_MIN_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def dp_bucket_bytes(layout: LayoutConfig, stack: SoftwareStack, bytes_per_param: float, stage: int,
                    chunk: int, first: bool = False) -> float:
    """Bytes per data-parallel bucket of ``stage``'s model ``chunk`` (gradients at ``bytes_per_param``, or the
    bf16 parameters ZeRO-1/2 all-gathers): the layout's ``grad_bucket_MiB`` where set; under the stack's
    Megatron-core bucketing (``SoftwareStack.megatron_buckets``) ``megatron_bucket_params`` (``--ddp-bucket-size``)
    or by default ``max(40M, 1M x dp)`` parameters on the first stage's first chunk and one bucket (infinite) on
    every other; else ``DEFAULT_BUCKET_MiB``. ``first``: the chunk's first gradient bucket of the step, which
    PyTorch DDP closes sooner (``SoftwareStack.ddp_first_bucket_MiB``; DDP without ZeRO only)."""
    if first and layout.shard_stage == 0 and stack.ddp_first_bucket_MiB is not None:
        return min(stack.ddp_first_bucket_MiB * MiB,
                   dp_bucket_bytes(layout, stack, bytes_per_param, stage, chunk))
    if layout.grad_bucket_MiB is not None:
        return layout.grad_bucket_MiB * MiB
    if not stack.megatron_buckets:
        return DEFAULT_BUCKET_MiB * MiB
    if stage > 0 or chunk > 0:
        return math.inf
    params = stack.megatron_bucket_params or max(MEGATRON_BUCKET_MIN_PARAMS,
                                                 MEGATRON_BUCKET_PARAMS_PER_DP_RANK * layout.data_degree)
    return params * bytes_per_param


def fsdp_keeps_unsharded(layout: LayoutConfig, stack: SoftwareStack) -> bool:
    """ZeRO-3/FSDP under pipeline parallelism with a stack that keeps each stage's parameters
    unsharded for the whole step (``SoftwareStack.fsdp_reshard_under_pp`` False: torchtitan)."""
    return layout.shard_stage >= 3 and layout.pp > 1 and not stack.fsdp_reshard_under_pp


def dp_overlaps(lay: LayoutConfig, stack: SoftwareStack) -> tuple[bool, bool]:
    """(gradient reduction, ZeRO-1/2 parameter all-gather) overlapped with compute: as the layout asks,
    unless the stack runs them as blocking steps under pipeline parallelism (``SoftwareStack.pp_dp_overlap``)."""
    blocking = lay.pp > 1 and not stack.pp_dp_overlap
    return lay.overlap_grad_reduce and not blocking, lay.overlap_param_gather and not blocking


def synchronous_p2p(stack: SoftwareStack, chunks_per_stage: int) -> bool:
    """Whether a schedule with ``chunks_per_stage`` model chunks per stage exchanges activations and gradients
    synchronously on ``stack`` (``SoftwareStack.synchronous_p2p``): the compute after a send waits for it, and
    the CPU waits for the GPU after each send and before the compute a receive feeds."""
    mode = stack.synchronous_p2p
    return mode is P2PSync.ALL or (mode is P2PSync.ONE_CHUNK and chunks_per_stage == 1)


def grad_reduce_collective(lay: LayoutConfig, stack: SoftwareStack) -> Collective:
    """The data-parallel gradient collective: an all-reduce without ZeRO (and for ZeRO-1 under PP on a
    stack that all-reduces, ``SoftwareStack.zero1_grad_all_reduce``), else a reduce-scatter to the owning
    shards."""
    if lay.shard_stage == 0 or (lay.shard_stage == 1 and lay.pp > 1 and stack.zero1_grad_all_reduce):
        return ALL_REDUCE
    return REDUCE_SCATTER


def fp32_grad_accumulation_kernel(lay: LayoutConfig, train: TrainConfig, stack: SoftwareStack,
                                  params: float) -> MemoryBound | None:
    """The per-micro-batch pass adding the BF16 gradients of ``params`` parameters into FP32 copies, where
    one runs (under pipeline parallelism); lowering and the search estimate add the same kernel to each
    chunk's backward. Two stacks run one:

    - DeepSpeed's pipeline engine with the BF16 optimizer (``SoftwareStack.fp32_grad_accumulation_pass``);
    - FSDP2 keeping a stage unsharded (``fsdp_keeps_unsharded``: torchtitan) with an FP32 reduce dtype:
      ``torch.distributed.pipelining`` turns gradient sync off until the last backward
      (``set_requires_gradient_sync(False)``), and each FSDP module's ``post_backward`` then adds the BF16
      unsharded gradient into an FP32 ``unsharded_accumulated_grad`` (the buffer ``memory.static_memory``
      holds) instead of letting autograd accumulate it in BF16
      (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``).
    """
    if stack.fp32_grad_accumulation_pass and lay.pp > 1:
        return MemoryBound("grad.fp32_accumulate", FP32_GRAD_ACCUMULATION_BYTES_PER_PARAM * params)
    if fsdp2_accumulates_fp32(lay, train, stack):
        return MemoryBound("grad.fp32_accumulate", FSDP2_UNSHARDED_ACCUMULATION_BYTES_PER_PARAM * params)
    return None


def fsdp2_accumulates_fp32(lay: LayoutConfig, train: TrainConfig, stack: SoftwareStack) -> bool:
    """A stage kept unsharded (``fsdp_keeps_unsharded``) whose reduce dtype is fp32: FSDP2 accumulates its
    micro-batches' gradients into fp32 ``unsharded_accumulated_grad`` tensors, which its reduce-scatter
    copy-in then reads (``fp32_grad_accumulation_kernel``)."""
    return fsdp_keeps_unsharded(lay, stack) and train.grad_bytes == 4.0


def tp_overlap_on(lay: LayoutConfig) -> bool:
    """Whether TP communication overlaps compute (``tp_comm_overlap`` with more than one TP rank)."""
    return lay.tp_comm_overlap and lay.tp > 1


def fp8_amax_casts(stack: SoftwareStack, tensorwise_sp: bool) -> Mapping[str, int]:
    """The FP8 casts per layer whose amax is all-reduced over the TP group (``BlockBuilder.amax_casts``):
    with per-tensor current scaling under sequence parallelism (``tensorwise_sp``), through torchao on
    DTensor TP (every cast of a sharded tensor) or Transformer Engine (the tensors it all-gathers in FP8);
    none otherwise."""
    if not tensorwise_sp:
        return {}
    return AMAX_CASTS_TORCHAO if stack.fp8_tp_gather else AMAX_CASTS_TE
