"""The hardware-neutral program and the cost pass (issue 27 part 1): lowering emits kernel descriptors
and no times; ``cost_pass.cost_program`` attaches times from one cost source (the roofline or a
calibrated profile) and nothing else."""

from __future__ import annotations

import copy
from dataclasses import fields, replace

import pytest

from simtrain.cost.cost_pass import cost_program, lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.calibrated import CalibratedCompute, Curve, GemmModel
from simtrain.hardware.load import load_gpu
from simtrain.lower.kernels import Attention, Gemm, MemoryBound, Sliced
from simtrain.lower.lowering import Lowered, lower_program
from simtrain.lower.ops import (
    CollectiveOp,
    CommOp,
    ComputeOp,
    CopyOp,
    CostedComputeOp,
    CostedCopyOp,
    Kernel,
    Op,
    OpKind,
    Program,
    SendOp,
    Stream,
)
from simtrain.plan.load import load_config
from simtrain.spec.collective_kinds import ALL_REDUCE, SEND
from simtrain.spec.config import RunConfig

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
    """Everything of a program's ops but times (kernels by name)."""
    out: list[tuple[object, ...]] = []
    for o in prog.ops:
        rest = tuple((f.name, getattr(o, f.name)) for f in fields(o) if f.name not in (
            "kernels", "duration_s", "expert_s", "host_stall_s", "host_sync", "host_hideable_s"))
        out.append((o.kind, rest, tuple(k.name for k in o.kernels) if isinstance(o, ComputeOp) else ()))
    return out


def _compute(prog: Program) -> list[CostedComputeOp]:
    return [o for o in prog.ops if isinstance(o, CostedComputeOp)]


@pytest.fixture(scope="module")
def dense() -> tuple[RunConfig, Lowered]:
    run = _run(DENSE)
    return run, lower_program(run)


def test_a_lowered_program_has_no_times(dense: tuple[RunConfig, Lowered]) -> None:
    _, low = dense
    ops = [o for p in low.programs for o in p.ops]
    compute = [o for o in ops if isinstance(o, ComputeOp) and o.kernels]
    assert compute
    kernels = [k for o in compute for k in o.kernels]
    assert all(isinstance(k, DESCRIPTORS) for k in kernels)
    # no op of a lowered program has a time field, nor has any of its kernels
    assert not any(hasattr(x, name) for x in (*ops, *kernels) for name in ("time_s", "duration_s", "expert_s"))
    assert not any(isinstance(o, CostedComputeOp | CostedCopyOp) for o in ops)
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
        times_a = [o.duration_s for o in _compute(a) if o.kernels]
        times_b = [o.duration_s for o in _compute(b) if o.kernels]
        assert all(t > 0 for t in times_a + times_b)
        assert sum(x != y for x, y in zip(times_a, times_b, strict=True)) > 0.9 * len(times_a)
        for op in _compute(a):  # a compute op lasts as long as its kernels, in kernel order
            assert op.duration_s == sum(k.time_s for k in op.kernels)


def test_the_costed_program_is_what_lower_gives(dense: tuple[RunConfig, Lowered]) -> None:
    run, low = dense
    roof = ComputeCostModel(load_gpu("h100-sxm"), run.train.precision)
    old = lower(run, roof)
    for prog, ref in zip(low.programs, old.programs, strict=True):
        new = cost_program(prog, roof)
        assert [(o.duration_s, o.expert_s) for o in _compute(new)] == [(o.duration_s, o.expert_s) for o in _compute(ref)]
        assert _structure(new) == _structure(ref)


def test_twice_the_hbm_bandwidth_speeds_up_exactly_the_memory_bound_kernels(dense: tuple[RunConfig, Lowered]) -> None:
    """Roofline: a memory-bound kernel's time above its launch halves; a compute-bound one keeps its time."""
    run, low = dense
    gpu = load_gpu("h100-sxm")
    slow = ComputeCostModel(gpu, run.train.precision)
    fast = ComputeCostModel(gpu.model_copy(update={"hbm_Bps": 2 * gpu.hbm_Bps}), run.train.precision)
    launch = gpu.kernel_launch_s
    seen = {MemoryBound: 0, Gemm: 0}
    descs = {k for p in low.programs for o in p.ops if isinstance(o, ComputeOp) for k in o.kernels}
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
    assert [(o.duration_s, o.expert_s) for o in _compute(first)] == [(o.duration_s, o.expert_s) for o in _compute(second)]
    assert _structure(prog) == before
    assert all(isinstance(k, DESCRIPTORS) for o in prog.ops if isinstance(o, ComputeOp) for k in o.kernels)
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
            kinds.add(type(old))
            if isinstance(old, CopyOp):
                assert isinstance(new, CostedCopyOp) and new.duration_s == old.comm_bytes / HOST_BPS > 0
            elif isinstance(old, ComputeOp):
                assert isinstance(new, CostedComputeOp)
                assert new.expert_s == sum(k.time_s for k in new.kernels if k.name.startswith("expert."))
            else:
                assert new is old
    assert kinds == {ComputeOp, CollectiveOp, SendOp, CopyOp}
    assert {k.kind for k in kinds} == set(OpKind)
    moe_ops = _compute(cost_program(*progs[-1]))
    assert any(o.expert_s > 0 for o in moe_ops)


def test_each_op_kind_has_only_its_own_fields() -> None:
    """A small tagged union: the fields every op has, and each kind's own."""
    common = {"idx", "stream", "name", "category", "deps", "remote", "microbatch", "chunk", "mem_start", "mem_end"}
    own = {ComputeOp: {"kernels", "sync_before"},
           CostedComputeOp: {"kernels", "sync_before", "duration_s", "expert_s", "host_stall_s", "host_sync",
                             "host_hideable_s"},
           CollectiveOp: {"coll", "axis", "comm_bytes", "host_issued", "sync_after"},
           SendOp: {"coll", "axis", "comm_bytes", "host_issued", "sync_after", "peer_stage"},
           CopyOp: {"axis", "comm_bytes"}, CostedCopyOp: {"axis", "comm_bytes", "duration_s"}}
    for cls, names in own.items():
        assert {f.name for f in fields(cls)} == common | names
    prog = Program(0)
    ops: list[Op] = [prog.add(OpKind.COMPUTE, Stream.COMPUTE, "c", kernels=(MemoryBound("act", 1e6),)),
                     prog.add(OpKind.COLLECTIVE, Stream.TP, "tp.all_reduce", coll=ALL_REDUCE, axis="tp"),
                     prog.add(OpKind.SEND, Stream.PP, "pp.send.F", coll=SEND, axis="pp", peer_stage=1),
                     prog.add(OpKind.COPY, Stream.OFFLOAD, "offload.d2h", comm_bytes=1e6),
                     prog.add(OpKind.COMPUTE, Stream.COMPUTE, "hand-made", duration_s=1.0)]
    assert [type(o) for o in ops] == [ComputeOp, CollectiveOp, SendOp, CopyOp, CostedComputeOp]
    assert all(isinstance(o, CommOp) for o in ops[1:3])
    assert [o.idx for o in ops] == list(range(5))
    with pytest.raises(TypeError):
        prog.add(OpKind.COLLECTIVE, Stream.TP, "x", kernels=())  # a collective has no kernels


def test_a_host_copy_needs_the_copy_rate() -> None:
    run = _run(OFFLOAD)
    prog = lower_program(run).programs[0]
    with pytest.raises(ValueError, match="host_Bps"):
        cost_program(prog, ComputeCostModel(load_gpu("h100-sxm"), "bf16"))


def test_calibration_enumerates_the_descriptors_of_a_lowered_program() -> None:
    """What a calibration measures is read off the lowered program (no cost model, no times); with TP the
    program also holds collectives, which have no kernels. Goldens from the per-rank shapes of
    ``simtrain.lower.blocks``: QKV (T, (q + 2 kv) / t, h), MLP up (T, 2 f / t, h), norm 2 x 2 B x (T / t) x h."""
    from calibration.shapes import CPU_DEFAULT_MODEL, Target, kernel_calls

    m, t, seq = CPU_DEFAULT_MODEL, 2, 512
    calls = kernel_calls(Target(m, tp=t, sp=True, seq_len=seq))
    assert ("qkv", "fwd", seq, (m.q_dim + 2 * m.kv_dim) // t, m.hidden) in calls.gemms
    assert ("mlp_up", "fwd", seq, 2 * m.ffn_hidden // t, m.hidden) in calls.gemms
    assert ("", "fwd", seq, m.hidden, m.ffn_hidden // t) in calls.gemms  # MLP down: a plain GEMM
    assert calls.memory_bytes["norm"] == 2 * 2.0 * (seq // t) * m.hidden
    assert calls.attention == {(1, seq, seq, m.n_heads // t, m.kv_heads // t, m.d_head, True, bwd) for bwd in (False, True)}


def test_the_engine_runs_only_a_costed_program() -> None:
    from simtrain.engine.engine import Engine
    from simtrain.hardware.topology import Topology
    from simtrain.plan.layout import RankGrid
    from simtrain.studies.simulate import cluster_of

    run = _run(OFFLOAD)
    cl = cluster_of(run)
    low = lower_program(run)
    with pytest.raises(ValueError, match="not costed"):
        Engine(low.programs, RankGrid(run.layout), Topology(cl), cl.gpu, trace=False)
    costed = [cost_program(p, _roofline(run)) for p in low.programs]
    assert Engine(costed, RankGrid(run.layout), Topology(cl), cl.gpu, trace=False).run().step_time_s > 0
