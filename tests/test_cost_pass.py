"""The hardware-neutral program and the cost pass (issue 27 part 1): lowering emits kernel descriptors
and no times; ``cost_pass.cost_program`` attaches times from one cost source (the roofline or a
calibrated profile) and nothing else."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from simtrain.calibrated import CalibratedCompute, Curve, GemmModel
from simtrain.config import RunConfig, load_config
from simtrain.cost_pass import cost_program
from simtrain.costs import ComputeCostModel
from simtrain.hardware import load_gpu
from simtrain.kernels import Attention, Gemm, MemoryBound, Sliced
from simtrain.lowering import Lowered, lower, lower_program
from simtrain.ops import Kernel, OpKind, Program

DESCRIPTORS = (Gemm, Attention, MemoryBound, Sliced)
TINY = {"preset": "llama3-8b", "n_layers": 4}
#: TP 2 with comm overlap (sliced and row-chunked GEMMs), PP 2 (sends), DP 2 with ZeRO-1 (collectives)
DENSE = {"model": TINY, "hardware": {"node": "dgx-h100", "n_nodes": 1},
         "layout": {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True, "tp_comm_overlap": True, "zero_stage": 1},
         "train": {"seq_len": 2048, "global_batch_seqs": 8}}
#: one GPU offloading activations to the host (copies)
OFFLOAD = {"model": TINY, "hardware": {"node": "dgx-h100", "n_nodes": 1, "gpus_per_node": 1},
           "layout": {"dp": 1, "offload_activation_layers": 2}, "train": {"seq_len": 2048, "global_batch_seqs": 2}}
SMALL_MOE = {"preset": "mixtral-8x7b", "n_layers": 2}
MOE = {"model": SMALL_MOE, "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"dp": 8, "ep": 8},
       "train": {"seq_len": 2048, "global_batch_seqs": 16}}
HOST_BPS = 50e9


def _run(cfg: dict) -> RunConfig:
    return load_config(copy.deepcopy(cfg))


def _roofline(run: RunConfig, **kw: object) -> ComputeCostModel:
    return ComputeCostModel(load_gpu("h100-sxm"), run.train.precision, host_Bps=HOST_BPS, **kw)  # type: ignore[arg-type]


def _synthetic_calibration() -> CalibratedCompute:
    """A calibrated profile: fitted GEMMs (no measured points) and one memory curve for every memory op."""
    gemm = GemmModel(t0_s=5e-6, peak_flops_per_s={"fwd": 4e14, "dgrad": 3.5e14, "wgrad": 3e14},
                     m_half=96.0, n_half=96.0, k_half=64.0)
    copy_curve = Curve((1e4, 1e6, 1e8, 1e10), (4e-6, 6e-6, 1.1e-4, 1.05e-2), 3e-6, 1e12)
    return CalibratedCompute(gemm=gemm, attention=None, memory_ops={"copy": copy_curve})


def _structure(prog: Program) -> list[tuple[object, ...]]:
    """Everything of a program's ops but times (and the costed kernels' own fields)."""
    return [(o.idx, o.kind, o.stream, o.name, o.category, o.deps, o.remote, tuple(k.name for k in o.kernels),
             o.coll, o.axis, o.comm_bytes, o.peer_stage, o.microbatch, o.chunk, o.mem_start, o.mem_end)
            for o in prog.ops]


@pytest.fixture(scope="module")
def dense() -> tuple[RunConfig, Lowered]:
    run = _run(DENSE)
    return run, lower_program(run)


def test_a_lowered_program_has_no_times(dense: tuple[RunConfig, Lowered]) -> None:
    _, low = dense
    compute = [o for p in low.programs for o in p.ops if o.kind == OpKind.COMPUTE and o.kernels]
    assert compute
    kernels = [k for o in compute for k in o.kernels]
    assert all(isinstance(k, DESCRIPTORS) for k in kernels)
    assert not any(hasattr(k, "time_s") for k in kernels)
    assert all(o.duration_s == 0.0 and o.expert_s == 0.0 for p in low.programs for o in p.ops)
    # TP comm overlap's chunks are structure, not time: slices of row-chunked GEMMs
    assert any(isinstance(k, Sliced) for k in kernels)
    assert any(isinstance(k, Sliced) and isinstance(k.of, Gemm) and k.of.row_chunks > 1 for k in kernels)


def test_two_sources_give_different_times_and_the_same_structure(dense: tuple[RunConfig, Lowered]) -> None:
    run, low = dense
    roof = _roofline(run)
    calibrated = _roofline(run, calibration=_synthetic_calibration())
    for prog in low.programs:
        a, b = cost_program(prog, roof), cost_program(prog, calibrated)
        assert _structure(a) == _structure(b) == _structure(prog)
        times_a = [o.duration_s for o in a.ops if o.kind == OpKind.COMPUTE and o.kernels]
        times_b = [o.duration_s for o in b.ops if o.kind == OpKind.COMPUTE and o.kernels]
        assert all(t > 0 for t in times_a + times_b)
        assert sum(x != y for x, y in zip(times_a, times_b, strict=True)) > 0.9 * len(times_a)
        for op in a.ops:  # a compute op lasts as long as its kernels, in kernel order
            if op.kind == OpKind.COMPUTE:
                assert op.duration_s == sum(k.time_s for k in op.kernels)  # type: ignore[union-attr]


def test_the_costed_program_is_what_lower_gives(dense: tuple[RunConfig, Lowered]) -> None:
    run, low = dense
    roof = ComputeCostModel(load_gpu("h100-sxm"), run.train.precision)
    old = lower(run, roof)
    for prog, ref in zip(low.programs, old.programs, strict=True):
        new = cost_program(prog, roof)
        assert [(o.duration_s, o.expert_s) for o in new.ops] == [(o.duration_s, o.expert_s) for o in ref.ops]
        assert _structure(new) == _structure(ref)


def test_twice_the_hbm_bandwidth_speeds_up_exactly_the_memory_bound_kernels(dense: tuple[RunConfig, Lowered]) -> None:
    """Roofline: a memory-bound kernel's time above its launch halves; a compute-bound one keeps its time."""
    run, low = dense
    gpu = load_gpu("h100-sxm")
    slow = ComputeCostModel(gpu, run.train.precision)
    fast = ComputeCostModel(gpu.model_copy(update={"hbm_Bps": 2 * gpu.hbm_Bps}), run.train.precision)
    launch = gpu.kernel_launch_s
    seen = {MemoryBound: 0, Gemm: 0}
    descs = {k for p in low.programs for o in p.ops for k in o.kernels}
    for d in descs:
        assert isinstance(d, DESCRIPTORS)
        t1, t2 = slow.kernel_time(d), fast.kernel_time(d)
        if isinstance(d, MemoryBound):
            seen[MemoryBound] += 1
            assert t2 - launch == pytest.approx((t1 - launch) / 2, rel=1e-12)
        elif isinstance(d, Gemm) and d.row_chunks == 1:
            eff = slow.gemm_efficiency(d.m, d.n, d.k)
            compute_s = d.flops / (gpu.bf16_flops_per_s * eff)
            memory_s = d.bytes / (gpu.hbm_Bps * gpu.hbm_efficiency)
            if compute_s > memory_s:
                seen[Gemm] += 1
                assert t2 == t1
            else:
                assert t2 < t1
    assert seen[MemoryBound] > 5 and seen[Gemm] > 5


def test_the_cost_pass_is_deterministic_and_leaves_its_input_alone(dense: tuple[RunConfig, Lowered]) -> None:
    run, low = dense
    roof = _roofline(run)
    prog = low.programs[0]
    before = _structure(prog)
    first, second = cost_program(prog, roof), cost_program(prog, roof)
    assert [(o.duration_s, o.expert_s) for o in first.ops] == [(o.duration_s, o.expert_s) for o in second.ops]
    assert _structure(prog) == before
    assert all(isinstance(k, DESCRIPTORS) for o in prog.ops for k in o.kernels)
    with pytest.raises(ValueError, match="already costed"):
        cost_program(first, roof)


def test_sliced_and_row_chunked_kernels_cost_as_before() -> None:
    roof = ComputeCostModel(load_gpu("h100-sxm"), "bf16")
    g = Gemm("mlp_up", 4096, 7168, 4096)
    whole = roof.kernel(g)
    assert whole == roof.gemm("mlp_up", 4096, 7168, 4096)
    chunked = roof.kernel(replace(g, row_chunks=4))
    assert chunked == roof.row_chunked(whole, 4) and chunked.time_s > whole.time_s
    piece = roof.kernel(Sliced(replace(g, row_chunks=4), 4))
    assert piece == Kernel("mlp_up", chunked.flops / 4, chunked.bytes / 4, chunked.time_s / 4)
    m = MemoryBound("act", 1e8)
    assert roof.kernel(m) == roof.memory_op("act", 1e8)
    a = Attention("flash_attn.bwd", 1, 4096, 4096, 16, 4, 128, causal=True, backward=True)
    assert roof.kernel(a) == roof.flash_attention("flash_attn.bwd", 1, 4096, 4096, 16, 4, 128, True, True)
    assert a.flops == roof.kernel(a).flops and a.bytes == roof.kernel(a).bytes


def test_every_op_kind_round_trips_through_the_cost_pass() -> None:
    """Compute, collective, send and host copy: the cost pass keeps every field but the times, which it
    sets on compute ops (kernels) and copies (host link); collectives and sends come through untouched."""
    progs: list[tuple[Program, ComputeCostModel]] = []
    for cfg in (DENSE, OFFLOAD, MOE):
        run = _run(cfg)
        progs += [(p, _roofline(run)) for p in lower_program(run).programs]
    kinds = set()
    for prog, roof in progs:
        costed = cost_program(prog, roof)
        assert _structure(costed) == _structure(prog)
        for old, new in zip(prog.ops, costed.ops, strict=True):
            kinds.add(old.kind)
            if old.kind == OpKind.COPY:
                assert new.duration_s == old.comm_bytes / HOST_BPS > 0
            elif old.kind == OpKind.COMPUTE:
                expert = sum(k.time_s for k in new.kernels if k.name.startswith("expert."))  # type: ignore[union-attr]
                assert new.expert_s == expert
            else:
                assert new is old
    assert kinds == set(OpKind)
    moe_ops = [o for p, roof in progs[-1:] for o in cost_program(p, roof).ops]
    assert any(o.expert_s > 0 for o in moe_ops)


def test_a_host_copy_needs_the_copy_rate() -> None:
    run = _run(OFFLOAD)
    prog = lower_program(run).programs[0]
    with pytest.raises(ValueError, match="host_Bps"):
        cost_program(prog, ComputeCostModel(load_gpu("h100-sxm"), "bf16"))
