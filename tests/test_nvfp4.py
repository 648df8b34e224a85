"""NVFP4 training (``train.precision = "fp4"``): the FP4 tensor-core rate, the NVFP4 quantisation kernels'
bytes, the memory it saves, the GPUs that reject it, and the csv / Megatron mappings."""

from __future__ import annotations

import math

import pytest

from simtrain.cli.main import main
from simtrain.cost.costs import K_FIXED, K_REFERENCE, ComputeCostModel
from simtrain.engine.invariants import peak_ratio
from simtrain.formats.megatron import read_megatron
from simtrain.formats.megatron_export import write_megatron
from simtrain.hardware.load import gpu_table, load_gpu
from simtrain.lower.memory import fp8_weight_cache_bytes
from simtrain.lower.nvfp4 import (
    NVFP4_CAST_BYTES_RHT,
    NVFP4_CAST_BYTES_WEIGHT,
    NVFP4_COPY_BYTES,
    NVFP4_SAVED_INPUT_SHARE,
    NVFP4_WEIGHT_CACHE_BYTES,
)
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.spec.stacks import STACKS
from simtrain.studies.simulate import simulate
from simtrain.validation.csv_cells import parse_precision

BLACKWELL = ("b200", "b300", "gb200", "gb300")
#: Dense FP4 peaks from the datasheets (TFLOP/s per GPU: sparse figure / 2 on B200 and GB200; B300 and GB300
#: publish their dense figure: 105 PF / 8 and 1,080 PF / 72).
DATASHEET_FP4_TFLOPS = {"b200": 9000.0, "b300": 13125.0, "gb200": 10000.0, "gb300": 15000.0}
#: Llama 3 70B's linear layers on one rank at TP 1, one 8192-token micro-batch: (n, k) of QKV, out, FC1, FC2.
LLAMA70B_LINEAR = ((10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))


def test_cast_bytes_per_element_by_hand() -> None:
    # one NVFP4 copy: a 4-bit value + one E4M3 byte per 16 elements
    assert NVFP4_COPY_BYTES == 0.5 + 1 / 16
    # activation / gradient with the RHT column-wise copy: amax read + row-wise cast read + column-wise
    # RHT cast read of the BF16 tensor (2 B each), two NVFP4 copies written
    assert NVFP4_CAST_BYTES_RHT == 2 + 2 + 2 + (0.5 + 1 / 16) + (0.5 + 1 / 16) == 7.125
    # weight (2-D blocks, no RHT): amax read, one cast kernel reading once and writing both copies
    assert NVFP4_CAST_BYTES_WEIGHT == 2 + 2 + 2 * (0.5 + 1 / 16) == 5.125
    assert NVFP4_WEIGHT_CACHE_BYTES == 1.125
    assert pytest.approx(0.28125) == NVFP4_SAVED_INPUT_SHARE


@pytest.mark.parametrize("gpu", BLACKWELL)
def test_blackwell_profiles_carry_the_datasheet_fp4_peak(gpu: str) -> None:
    g = load_gpu(gpu)
    assert g.has_fp4 and g.fp4_flops_per_s == DATASHEET_FP4_TFLOPS[gpu] * 1e12
    assert g.peak_flops_per_s("fp4") == g.fp4_flops_per_s
    assert 0 < g.fp4_gemm_efficiency < 1
    assert peak_ratio(g, "fp4") == g.fp4_flops_per_s / g.bf16_flops_per_s


def test_fp4_gemm_time_in_closed_form_on_b200() -> None:
    """8192^3 NVFP4 GEMM on B200 (forward, no weight cache): FP4 peak 9000 TF x 0.582 (cuBLASLt 8192^3,
    DeepGEMM#348) x wave quantisation x depth factor at 4x BF16's fixed depth, plus the casts of A (7.125 B per
    element) and of the weight (5.125 B), plus one launch."""
    g = load_gpu("b200")
    n = 8192
    tiles = (n // 256) * (n // 128)  # 256x128 tiles on CTA pairs
    slots = 148 // 2
    wave_q = tiles / (math.ceil(tiles / slots) * slots)
    depth = (n / (n + 4 * K_FIXED)) * (K_REFERENCE + 4 * K_FIXED) / K_REFERENCE
    assert depth == 1.0
    compute_s = 2 * n**3 / (9000e12 * 0.582 * wave_q * depth)
    cast_s = (7.125 + 5.125) * n * n / (8e12 * 0.72)
    expected = compute_s + cast_s + 4e-6
    k = ComputeCostModel(g, "fp4").gemm("mlp.fc1", n, n, n)
    assert k.time_s == pytest.approx(expected, rel=1e-12)
    assert k.flops == 2 * n**3
    assert k.bytes == (0.5 + 1 / 16) * 2 * n * n + 2 * n * n  # NVFP4 operands, BF16 output
    # a stack that caches quantised weights over the step's micro-batches leaves the weight cast out
    cached = ComputeCostModel(g, "fp4", stack=STACKS["megatron-te"]).gemm("mlp.fc1", n, n, n)
    assert cached.time_s == pytest.approx(expected - 5.125 * n * n / (8e12 * 0.72), rel=1e-12)
    # wgrad reuses the copies: no cast at all
    wgrad = ComputeCostModel(g, "fp4").gemm("mlp.fc1.wgrad", n, n, n)
    assert wgrad.time_s == pytest.approx(compute_s + 4e-6, rel=1e-12)


def test_attention_lm_head_and_router_stay_bf16_under_fp4() -> None:
    g = load_gpu("b200")
    for name in ("lm_head", "attn.qk", "router"):
        assert ComputeCostModel(g, "fp4").gemm(name, 8192, 8192, 8192).time_s == \
            ComputeCostModel(g, "bf16").gemm(name, 8192, 8192, 8192).time_s


@pytest.mark.parametrize("gpu", BLACKWELL)
@pytest.mark.parametrize("role", ["", ".dgrad", ".wgrad"])
def test_fp4_gemm_is_faster_than_fp8_but_never_twice(gpu: str, role: str) -> None:
    """FP4 doubles (B200, GB200) or triples (B300, GB300) the tensor-core peak of FP8, but its sustained
    fraction, its casts (7.125 B per element against FP8's 4-6) and its fixed per-tile cost keep every
    linear-layer GEMM of a training step within (1, 2]x the FP8 twin's speed (B300/GB300: (1, 3])."""
    g = load_gpu(gpu)
    fp8 = ComputeCostModel(g, "fp8", stack=STACKS["megatron-te"], fp8_recipe="blockwise")
    fp4 = ComputeCostModel(g, "fp4", stack=STACKS["megatron-te"])
    bound = g.fp4_flops_per_s / g.fp8_flops_per_s
    for n, k in LLAMA70B_LINEAR:
        name = "mlp.fc1" + role
        speedup = fp8.gemm(name, 8192, n, k).time_s / fp4.gemm(name, 8192, n, k).time_s
        assert 1.0 < speedup <= bound


def _run(precision: str, gpu_node: str = "gb200-nvl72") -> dict:
    return dict(model="llama3-8b", hardware=dict(node=gpu_node, n_nodes=1, gpus_per_node=8),
                layout=dict(dp=8),
                train=dict(seq_len=8192, micro_batch_size=1, global_batch_seqs=64, precision=precision,
                           fp8_recipe="blockwise", stack="megatron-te"))


def test_fp4_step_is_faster_than_its_fp8_twin_and_saves_memory() -> None:
    fp8 = simulate(load_config(_run("fp8")))
    fp4 = simulate(load_config(_run("fp4")))
    bf16 = simulate(load_config(_run("bf16")))
    assert fp4.step_time_s < fp8.step_time_s < bf16.step_time_s
    assert fp4.step_time_s > fp8.step_time_s / 2  # attention, norms, communication stay as they are
    # MFU is against the dense BF16 peak for every precision (same model FLOPs, shorter step)
    assert fp4.mfu / fp8.mfu == pytest.approx(fp8.step_time_s / fp4.step_time_s, rel=1e-9)
    assert max(m.peak_bytes for m in fp4.memory) < max(m.peak_bytes for m in fp8.memory)


def test_fp4_weight_cache_and_saved_inputs() -> None:
    run = load_config(_run("fp4"))
    assert fp8_weight_cache_bytes(1e9, run.layout, run.train, 1) == 1.125e9
    run8 = load_config(_run("fp8"))
    assert fp8_weight_cache_bytes(1e9, run8.layout, run8.train, 1) == 2.0e9


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb", "h200", "mi300x"])
def test_gpus_without_fp4_reject_it(gpu: str) -> None:
    g = load_gpu(gpu)
    assert not g.has_fp4
    with pytest.raises(ConfigError, match=r"train\.precision.*fp4.*no FP4"):
        g.peak_flops_per_s("fp4")


def test_hopper_rejects_fp4_on_the_cli_with_exit_2(capsys) -> None:
    rc = main(["simulate", "examples/llama3_70b_h100.yaml", "--set", "train.precision=fp4"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.precision" in err and "'fp4'" in err and "bf16, fp16 or fp8" in err
    assert "Traceback" not in err


def test_unknown_precision_lists_fp4_among_the_valid_values(capsys) -> None:
    rc = main(["simulate", "examples/llama3_70b_gb200_offload.yaml", "--set", "train.precision=fp2"])
    assert rc == 2 and "fp4" in capsys.readouterr().err


def test_csv_nvfp4_cells_map_to_fp4_on_blackwell() -> None:
    te = STACKS["megatron-te"]
    assert parse_precision("NVFP4", te, has_fp8=True, has_fp4=True) == ("fp4", te.fp8_recipe, [])
    p, _, notes = parse_precision("mxfp4", te, has_fp8=True, has_fp4=True)
    assert p == "fp4" and "MXFP4 simulated as NVFP4" in notes[0]
    # a GPU without FP4 runs the nearest it can, and says so
    p, r, notes = parse_precision("NVFP4", te, has_fp8=True, has_fp4=False)
    assert (p, r) == ("fp8", "blockwise") and "without FP4" in notes[0]
    assert parse_precision("nvfp4", te, has_fp8=False)[0] == "bf16"


def test_megatron_fp4_flags_round_trip() -> None:
    run = load_config(_run("fp4"))
    text, _ = write_megatron(run)
    assert "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text
    back = read_megatron(text, base={"hardware": run.hardware.model_dump()})
    assert back.config.train.precision == "fp4"


def test_hardware_table_lists_the_fp4_peak() -> None:
    rows = {r["name"]: r for r in gpu_table()}
    assert rows["b200"]["fp4_tflops"] == 9000.0 and rows["h100-sxm"]["fp4_tflops"] is None
