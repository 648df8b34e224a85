"""FlashAttention's rate by kernel, key length, mask and head dim (``simtrain.cost.attention_rates``): the FA3
paper's measured ratios come back out of the cost model, the profile's kernel at the reference shape runs at
the profile's efficiency, and the stacks pick the kernel their framework runs."""

from __future__ import annotations

from typing import Any

import pytest

from simtrain.cost.attention_rates import (
    BWD_TFLOPS,
    FWD_TFLOPS,
    KEYS,
    REFERENCE_KEYS,
    profile_kernel,
    shape_factor,
)
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.spec.stacks import resolve_stack, stack_choice


def _model(gpu: str, stack: Any) -> ComputeCostModel:
    return ComputeCostModel(load_gpu(gpu), "bf16", stack=resolve_stack(stack_choice(stack)))


def _rate(cost: ComputeCostModel, keys: int, causal: bool, backward: bool = False) -> float:
    """FLOP/s of a kernel on 16k tokens x 1,024 heads of 128 (the paper's 16k tokens, with heads enough that the
    4 us launch tail is under 0.5 % of the shortest kernel)."""
    k = cost.flash_attention("attn", 16384 // keys, keys, keys, 1024, 1024, 128, causal, backward)
    return k.flops / k.time_s


@pytest.mark.parametrize("has_fp8", [True, False])
@pytest.mark.parametrize("backward", [False, True])
def test_the_profile_kernel_at_the_reference_shape_is_the_profile_rate(has_fp8: bool, backward: bool) -> None:
    assert shape_factor(profile_kernel(has_fp8), False, REFERENCE_KEYS, backward, has_fp8) == pytest.approx(1.0)


def test_an_uncalibrated_h100_reproduces_the_papers_ratios() -> None:
    """TE's cuDNN attention on H100 against the FA3 paper's bars (Fig. 5 c/d, Fig. 6): the cost model's rate
    at each length and mask over its rate at the reference shape is the paper's ratio (1 % for the launch
    tail and the interpolation-free table points)."""
    te = _model("h100-sxm", "megatron-te")
    ref_f, ref_b = _rate(te, REFERENCE_KEYS, False), _rate(te, REFERENCE_KEYS, False, True)
    assert ref_f == pytest.approx(0.570 * 989e12, rel=0.01)  # the profile's efficiency, sustained
    for i, keys in enumerate(KEYS):
        assert _rate(te, keys, True) / ref_f == pytest.approx(FWD_TFLOPS["cudnn"][True][i] / 595, rel=0.01)
        assert _rate(te, keys, False) / ref_f == pytest.approx(FWD_TFLOPS["cudnn"][False][i] / 595, rel=0.01)
        assert _rate(te, keys, False, True) / ref_b == pytest.approx(BWD_TFLOPS["cudnn"][i] / 516, rel=0.01)
    # at 4k keys, causal: 518 of the reference's 595 TF forward; FA2 (torch SDPA) 319, FA3 itself 579
    fa2, fa3 = _model("h100-sxm", "torchtitan-compile"), _model("h100-sxm", {"preset": "megatron-te", "attention": "fa3"})
    assert _rate(fa2, 4096, True) / ref_f == pytest.approx(319 / 595, rel=0.01)
    assert _rate(fa3, 4096, True) / ref_f == pytest.approx(579 / 595, rel=0.01)


@pytest.mark.parametrize("kind", ["cudnn", "fa3", "fa2"])
def test_causal_is_slower_than_unmasked_and_short_keys_slower_than_long(kind: str) -> None:
    for backward in (False, True):
        rates = [shape_factor(kind, True, k, backward, True) for k in KEYS]  # type: ignore[arg-type]
        assert rates == sorted(rates)  # every kernel's causal rate rises with the keys it loops over
        for k in KEYS:
            assert shape_factor(kind, True, k, backward, True) < shape_factor(kind, False, k, backward, True)  # type: ignore[arg-type]
    # between and beyond the measured lengths: interpolated in log2, then clamped
    mid = shape_factor(kind, True, 3000, False, True)  # type: ignore[arg-type]
    assert shape_factor(kind, True, 2048, False, True) < mid < shape_factor(kind, True, 4096, False, True)  # type: ignore[arg-type]
    assert shape_factor(kind, True, 128, False, True) == shape_factor(kind, True, 512, False, True)  # type: ignore[arg-type]
    assert shape_factor(kind, False, 1 << 20, True, True) == shape_factor(kind, False, 16384, True, True)  # type: ignore[arg-type]


@pytest.mark.parametrize(("gpu", "stack", "kind"), [
    ("h100-sxm", "megatron-te", "cudnn"),            # TE prefers its cuDNN FusedAttention on Hopper and later
    ("b200", "megatron-te", "cudnn"),
    ("h100-sxm", "torchtitan-compile", "fa2"),       # torch SDPA's flash backend
    ("h100-sxm", {"preset": "torchtitan-compile", "attention": "fa3"}, "fa3"),
    ("a100-80gb", "megatron-te", "fa2"),             # before Hopper FA2 is the best kernel
    ("a100-80gb", {"preset": "megatron-te", "attention": "fa3"}, "fa2"),
])
def test_each_stack_runs_its_frameworks_kernel(gpu: str, stack: Any, kind: str) -> None:
    assert _model(gpu, stack).attention_kind() == kind


def test_a_100_runs_fa2_at_its_profile_rate_on_long_unmasked_keys() -> None:
    """The A100 profile holds FA2's rate at the reference shape (73 % of peak, x 0.948 sustained)."""
    a100 = _model("a100-80gb", "megatron-te")
    assert _rate(a100, REFERENCE_KEYS, False) == pytest.approx(0.692 * 312e12, rel=0.01)
    assert _rate(a100, 2048, True) / _rate(a100, REFERENCE_KEYS, False) == pytest.approx(298 / 370, rel=0.01)
