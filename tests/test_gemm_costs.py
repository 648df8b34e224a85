"""GEMM cost model facts: tile and wave quantisation, reduction depth, and measured Hopper rates."""

from __future__ import annotations

from typing import Any

import pytest

from simtrain.cost.costs import K_FIXED, K_REFERENCE, ComputeCostModel, depth_factor
from simtrain.hardware.load import load_gpu

#: XLA's measured sm_90 (H100 SXM) BF16 GEMM rates, flops/s, for b = 1 (openxla/xla
#: xla/service/gpu/model/matmul_interpolator_data.h). Keyed (m, n, k). The table times single
#: launches after a warm-up (burst clocks), so only rates relative to its 4096^3 entry are compared.
XLA_SM90_BF16_FLOPS_PER_S = {
    (4096, 4096, 4096): 786.048e12,
    (4096, 4096, 2048): 739.874e12,
    (4096, 4096, 1024): 681.092e12,
    (4096, 4096, 512): 543.392e12,
    (4096, 4096, 256): 393.024e12,
    (4096, 2048, 4096): 764.093e12,
    (2048, 4096, 1024): 593.884e12,
}


def _rate(cost: ComputeCostModel, m: int, n: int, k: int) -> float:
    return 2 * m * n * k / cost.gemm("x", m, n, k).time_s


def test_depth_factor_is_one_at_reference_and_grows_with_depth():
    assert depth_factor(K_REFERENCE) == pytest.approx(1.0)
    ks = [64, 128, 256, 512, 1024, 4096, 8192, 16384]
    rates = [depth_factor(k) for k in ks]
    assert rates == sorted(rates)
    # at k = K_FIXED the main loop and the fixed cost take equal time: half the long-K rate
    assert depth_factor(K_FIXED) == pytest.approx(0.5 * (K_REFERENCE + K_FIXED) / K_REFERENCE)
    assert depth_factor(10**9) < (K_REFERENCE + K_FIXED) / K_REFERENCE + 1e-9


def test_tile_and_wave_quantisation():
    gpu = load_gpu("h100-sxm")
    cost = ComputeCostModel(gpu, "bf16")
    m = 128 * gpu.sm_count  # 132 x 8 output tiles of 128x128: exactly 8 full waves
    full = cost.gemm_efficiency(m, 1024, 8192)
    assert full == pytest.approx(gpu.gemm_efficiency * depth_factor(8192), rel=1e-12)
    # 64 x 64 = 4096 tiles take 32 waves of 132, the last one 4 tiles short
    assert cost.gemm_efficiency(8192, 8192, 8192) == pytest.approx(full * 4096 / (32 * gpu.sm_count), rel=1e-12)
    # one row past a 128-row tile: the extra tile row does 1/128 of its work
    assert cost.gemm_efficiency(m + 1, 1024, 8192) < full
    # one 128x128 tile fills one SM of the first wave
    assert cost.gemm_efficiency(128, 128, 8192) == pytest.approx(full / gpu.sm_count, rel=1e-12)


@pytest.mark.parametrize("shape", [s for s in XLA_SM90_BF16_FLOPS_PER_S if s != (4096, 4096, 4096)])
def test_relative_rate_matches_xla_sm90_table(shape):
    """Rate relative to 4096^3 within 10 % of XLA's measured table for K >= 512 (K = 256: 16 %; the
    21 us kernel also pays a launch the table hides)."""
    cost = ComputeCostModel(load_gpu("h100-sxm"), "bf16")
    model = _rate(cost, *shape) / _rate(cost, 4096, 4096, 4096)
    measured = XLA_SM90_BF16_FLOPS_PER_S[shape] / XLA_SM90_BF16_FLOPS_PER_S[(4096, 4096, 4096)]
    tol = 0.16 if shape[2] < 512 else 0.10
    assert model == pytest.approx(measured, rel=tol)


def test_short_k_fp8_pays_more_than_bf16():
    """FP8 streams twice the elements per main-loop step, so a given K is half as deep."""
    cost = ComputeCostModel(load_gpu("h100-sxm"), "fp8")
    bf16 = cost.gemm_efficiency(4096, 4096, 512) / cost.gemm_efficiency(4096, 4096, 8192)
    fp8 = cost.gemm_efficiency(4096, 4096, 512, fp8=True) / cost.gemm_efficiency(4096, 4096, 8192, fp8=True)
    assert fp8 < bf16


def _attention_rate(cost: ComputeCostModel, d: int) -> float:
    k = cost.flash_attention("fa", 1, 8192, 8192, 16, 16, d, causal=False, backward=False)
    return k.flops / k.time_s


@pytest.mark.parametrize(("gpu", "stack", "ratio_64", "ratio_256"), [
    ("h100-sxm", "megatron-te", 0.70, 0.96),         # TE's cuDNN attention, FA3 paper Fig. 5: 408-413, 581 / 595-609
    ("h100-sxm", {"preset": "torchtitan-compile", "attention": "fa3"}, 0.76, 1.15),  # FA3: 476-497 / 638-648
    ("h100-sxm", "torchtitan-compile", 0.87, 1.0),   # FA2 on the same figure: 321-324 / 368-370
    ("a100-80gb", "megatron-te", 0.87, 1.0),         # before Hopper the best kernel is FA2
])
def test_flash_attention_rate_follows_the_head_dim(gpu: str, stack: Any, ratio_64: float, ratio_256: float) -> None:
    from simtrain.spec.stacks import resolve_stack, stack_choice

    cost = ComputeCostModel(load_gpu(gpu), "bf16", stack=resolve_stack(stack_choice(stack)))
    base = _attention_rate(cost, 128)
    assert _attention_rate(cost, 64) / base == pytest.approx(ratio_64, rel=0.02)
    assert _attention_rate(cost, 256) / base == pytest.approx(ratio_256, rel=0.02)
    assert _attention_rate(cost, 64) < _attention_rate(cost, 96) < base  # monotone between the points
