"""The vocab-parallel cross-entropy's cost per stack, by hand from the kernels each framework launches.

Bytes per logit element through HBM (module docstring of ``simtrain.spec.stack_spec``): the one-kernel
reference the lowering emits is 10 forward + 6 backward; Megatron-core's jit-fused path (native impl, what
NeMo and Megatron-Bridge recipes run) 26 + 14 = 40 in ~5 kernels a direction; its unfused path and
pre-Megatron-Core Megatron-LM / Megatron-DeepSpeed 38 + 14 = 52 in ~7.
"""

from __future__ import annotations

import pytest

from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.spec.stack_spec import FUSED, MEGATRON_FUSED_LOSS, MEGATRON_UNFUSED_LOSS
from simtrain.spec.stacks import STACKS

T, V = 8192, 128256  # one 8k-token micro-batch, a 128k vocabulary on one TP rank
FWD_REF, BWD_REF = 10.0, 6.0  # bytes per element the lowering charges the one-kernel reference


def _ce(stack: str, backward: bool = False) -> float:
    cost = ComputeCostModel(load_gpu("h100-sxm"), "bf16", stack=STACKS[stack])
    name = "cross_entropy.bwd" if backward else "cross_entropy"
    return cost.memory_op(name, T * V * (BWD_REF if backward else FWD_REF)).time_s


def test_megatron_fused_loss_counts_its_passes_over_the_fp32_logits() -> None:
    # forward: upcast + max 2+4, exp in place 4+4, sum 4, divide in place 4+4; backward: scale 4+4, cast 4+2
    assert (2 + 4) + (4 + 4) + 4 + (4 + 4) == 26 and (4 + 4) + (4 + 2) == 14
    assert MEGATRON_FUSED_LOSS.bytes_factor == pytest.approx((26 + 14) / (FWD_REF + BWD_REF))
    assert MEGATRON_UNFUSED_LOSS.bytes_factor == pytest.approx((38 + 14) / (FWD_REF + BWD_REF))


def test_megatron_te_cross_entropy_time_by_hand() -> None:
    gpu = load_gpu("h100-sxm")
    rate = gpu.hbm_Bps * gpu.memory_op_efficiency  # 3.35 TB/s x 0.72
    expected = 2.5 * T * V * FWD_REF / rate + 5 * gpu.kernel_launch_s
    assert _ce("megatron-te") == pytest.approx(expected, rel=1e-12)
    # ~11 ms a micro-batch on H100: 2.5x the one-kernel reference's bytes
    assert 10e-3 < _ce("megatron-te") < 12e-3


@pytest.mark.parametrize("stack", ["megatron-te", "megatron-legacy", "deepspeed", "megatron-core"])
def test_megatron_losses_are_never_cheaper_than_one_fused_kernel(stack: str) -> None:
    one_kernel = ComputeCostModel(load_gpu("h100-sxm"), "bf16", stack=STACKS[stack].model_copy(
        update={"fusion": STACKS[stack].fusion.model_copy(update={"loss": FUSED})}))
    for backward in (False, True):
        name = "cross_entropy.bwd" if backward else "cross_entropy"
        nbytes = T * V * (BWD_REF if backward else FWD_REF)
        assert _ce(stack, backward) > 2 * one_kernel.memory_op(name, nbytes).time_s


def test_which_megatron_stack_runs_which_loss() -> None:
    assert STACKS["megatron-te"].fusion.loss == MEGATRON_FUSED_LOSS  # --cross-entropy-loss-fusion, native
    for unfused in ("megatron-core", "megatron-legacy", "deepspeed"):
        assert STACKS[unfused].fusion.loss == MEGATRON_UNFUSED_LOSS
    # the unfused path moves 52 bytes an element to the fused path's 40: 1.3x its time on large vocabularies
    assert _ce("megatron-core") / _ce("megatron-te") == pytest.approx(52 / 40, rel=0.01)
