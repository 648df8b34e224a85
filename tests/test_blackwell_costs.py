"""Blackwell GEMMs (issue 29 part 2): the GPU profile's output tile and tiles in flight (CUTLASS SM100 2-SM
kernels: a 256x128 tile per pair of SMs), and its GEMM rate from a published B200 back-to-back GEMM
(pytorch/ao#2427: torch.mm BF16 8192^3 1.42 PF) instead of MAMF x an A100 burst-to-sustained ratio.
Closed forms from the cited numbers; Hopper must not move."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simtrain.cost.costs import TILE_M, TILE_N, ComputeCostModel, depth_factor
from simtrain.hardware.load import load_gpu
from simtrain.hardware.profile_paths import ProfileKind, resolve
from simtrain.spec.errors import ConfigError

BLACKWELL = ("b200", "b300", "gb200", "gb300")
#: pytorch/ao#2427, NVIDIA B200, torch.mm BF16 (randn inputs, GPU kernel time): M = K = N -> FLOP/s
B200_TORCH_MM_BF16 = {4096: 1.41e15, 6144: 1.45e15, 8192: 1.42e15}
#: ml-engineering MAMF table (reference Table D), best-shape BF16 / FP8 TFLOP/s
MAMF_TF = {"b200": (1745.0, 3433.0), "b300": (1769.0, 3433.0), "gb200": (1822.0, 3616.0), "gb300": (1822.0, 3616.0)}


@pytest.mark.parametrize("name", BLACKWELL)
def test_blackwell_profiles_tile_256x128_on_sm_pairs(name: str) -> None:
    gpu = load_gpu(name)
    assert (gpu.gemm_tile_m, gpu.gemm_tile_n, gpu.gemm_tile_sms) == (256, 128, 2)
    assert gpu.gemm_tile_slots == gpu.sm_count // 2


@pytest.mark.parametrize("name", ["a100-80gb", "h100-sxm", "h200"])
def test_hopper_and_ampere_keep_128x128_per_sm(name: str) -> None:
    gpu = load_gpu(name)
    assert (gpu.gemm_tile_m, gpu.gemm_tile_n, gpu.gemm_tile_sms) == (TILE_M, TILE_N, 1)
    assert gpu.gemm_tile_slots == gpu.sm_count


def test_b200_tile_and_wave_quantisation_closed_form() -> None:
    gpu = load_gpu("b200")
    cost = ComputeCostModel(gpu, "bf16")
    full = gpu.gemm_efficiency * depth_factor(8192)
    # 74 pairs x one 256x128 tile each: exactly one full wave
    assert cost.gemm_efficiency(256 * 74, 128, 8192) == pytest.approx(full, rel=1e-12)
    # 8192^3: 32 x 64 = 2048 tiles take 28 waves of 74 (2072 slots)
    assert cost.gemm_efficiency(8192, 8192, 8192) == pytest.approx(full * 2048 / (28 * 74), rel=1e-12)
    # 128 rows: half of a pair's 256-row tile, one of 74 slots
    assert cost.gemm_efficiency(128, 128, 8192) == pytest.approx(full / 2 / 74, rel=1e-12)
    # a 3000-column FP8 GEMM: 24 column tiles, the last 56 columns of 128 wide
    fp8 = ComputeCostModel(gpu, "fp8")
    tiles = math.ceil(4096 / 256) * math.ceil(3000 / 128)  # 16 x 24 = 384 tiles, 6 waves of 74
    tile_q = 3000 / (24 * 128)
    assert fp8.gemm_efficiency(4096, 3000, 8192, fp8=True) == pytest.approx(
        gpu.fp8_gemm_efficiency * depth_factor(8192, 256) * tile_q * tiles / (6 * 74), rel=1e-12)


def test_b200_bf16_gemm_reproduces_the_published_sweep() -> None:
    """The profile rate is pytorch/ao#2427's 8192^3 rate over the peak (1.42 PF / 2250 TF); with the model's
    tile x wave x depth factors the 4096^3-8192^3 points of that sweep come out within 6 % (GEMM time
    without the launch tail), and never faster than measured."""
    gpu = load_gpu("b200")
    assert gpu.gemm_efficiency == pytest.approx(1.42e15 / gpu.bf16_flops_per_s, abs=5e-4)
    cost = ComputeCostModel(gpu, "bf16")
    for n, measured in B200_TORCH_MM_BF16.items():
        model = 2.0 * n**3 / (cost.gemm("x", n, n, n).time_s - gpu.kernel_launch_s)
        assert model == pytest.approx(measured, rel=0.06)
        assert model <= measured


@pytest.mark.parametrize("name", BLACKWELL)
def test_blackwell_rates_are_mamf_times_the_b200_sustained_ratio(name: str) -> None:
    """Every Blackwell profile rate is its MAMF x B200's measured typical/MAMF ratio 1420 / 1745 (the A100
    ratio 0.948 it replaces made B200 GEMMs 13 % faster than measured)."""
    gpu = load_gpu(name)
    ratio = 1420.0 / 1745.0
    bf16, fp8 = MAMF_TF[name]
    assert gpu.gemm_efficiency * gpu.bf16_flops_per_s / 1e12 == pytest.approx(bf16 * ratio, rel=0.006)
    assert gpu.fp8_gemm_efficiency * gpu.fp8_flops_per_s / 1e12 == pytest.approx(fp8 * ratio, rel=0.006)
    # slower than the A100-ratio rate it replaces, never faster
    assert gpu.gemm_efficiency * gpu.bf16_flops_per_s / 1e12 < bf16 * 0.948


@pytest.mark.parametrize("name", BLACKWELL)
def test_blackwell_attention_runs_at_cudnns_b200_rate_times_the_sustained_ratio(name: str) -> None:
    """Attention feeds the same tensor cores at the same power-limited clock as the GEMMs: cuDNN's B200
    forward (FlashAttention-4, arXiv 2603.05451: 1613 TF, up to 1.3x cuDNN, so ~1240 TF = 0.551 of 2250)
    x B200's sustained/MAMF ratio 1420 / 1745 (was x A100's 0.948: 0.5); the backward keeps its assumed
    0.8 of the forward."""
    gpu = load_gpu(name)
    fwd = 1613.0 / 1.3 / 2250.0 * (1420.0 / 1745.0)
    assert gpu.attention_fwd_efficiency == pytest.approx(fwd, abs=0.005)
    assert gpu.attention_bwd_efficiency == pytest.approx(0.8 * gpu.attention_fwd_efficiency, rel=1e-9)
    assert gpu.attention_fwd_efficiency < 0.5  # slower than the A100-ratio rate it replaces


def test_hopper_gemm_rate_unchanged() -> None:
    gpu = load_gpu("h100-sxm")
    assert (gpu.gemm_efficiency, gpu.fp8_gemm_efficiency) == (0.762, 0.672)


def test_gemm_tile_fields_are_validated(tmp_path) -> None:
    text = Path(str(resolve(ProfileKind.GPUS, "b200", "hardware.gpu"))).read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("gemm_tile_sms: 2", "gemm_tile_sms: 0"), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_gpu(str(bad))
    assert "gemm_tile_sms" in str(err.value)
