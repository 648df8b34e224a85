"""The engine against closed forms: pipeline bubbles on hand-built programs, op accounting, ordering."""

from __future__ import annotations

from collections import defaultdict

import pytest

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.engine.engine import Engine
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology
from simtrain.lower.ops import OpKind, Program, Stream
from simtrain.plan.layout import RankGrid
from simtrain.plan.load import load_config
from simtrain.plan.schedules import Action, build_schedule
from simtrain.spec.collective_kinds import ALL_REDUCE, SEND
from simtrain.spec.config import LayoutConfig
from simtrain.studies.simulate import cluster_of, simulate

TF, TB = 1.0, 2.0
HOP_SLACK = 1e-3  # s: pipeline-send latencies (~13 us per hop, a few dozen hops) on a >10 s step; any
# scheduling error would be a multiple of TF / v >= 0.25 s


def _programs(kind: str, p: int, m: int, v: int, tf: float = TF, tb: float = TB) -> list[Program]:
    """One compute op per action (F: tf/v, B: tb/v) plus a 1-byte send to the next virtual stage."""
    sched = build_schedule(kind, p, m, v)
    progs = [Program(s) for s in range(p)]
    sends: dict[tuple[int, Action], int] = {}
    computes: dict[tuple[int, Action], int] = {}
    n_virtual = p * v
    for s in range(p):
        for a in sched[s]:
            vs = a.chunk * p + s
            op = progs[s].add(OpKind.COMPUTE, Stream.COMPUTE, f"{a.kind}{a.microbatch}.{a.chunk}",
                              category="fwd" if a.kind == "F" else "bwd",
                              duration_s=(tf if a.kind == "F" else tb) / v, microbatch=a.microbatch, chunk=a.chunk)
            computes[(s, a)] = op.idx
            dst = vs + 1 if a.kind == "F" else vs - 1
            if 0 <= dst < n_virtual:
                send = progs[s].add(OpKind.SEND, Stream.PP, f"send.{a.kind}", category="comm", deps=(op.idx,),
                                    coll=SEND, axis="pp", comm_bytes=1.0, peer_stage=dst % p,
                                    microbatch=a.microbatch, chunk=a.chunk)
                sends[(s, a)] = send.idx
    for s in range(p):
        for a in sched[s]:
            vs = a.chunk * p + s
            src = vs - 1 if a.kind == "F" else vs + 1
            if 0 <= src < n_virtual:
                ss = src % p
                progs[s].ops[computes[(s, a)]].remote = (ss, sends[(ss, Action(a.kind, a.microbatch, src // p))])
    return progs


def _engine(progs: list[Program], p: int, symmetric: bool = True) -> Engine:
    cl = build_cluster("dgx-h100", 1)
    # no compute slowdown while a send is in flight, so compute times are exact
    gpu = cl.gpu.model_copy(update={"comm_interference_nvlink": 0.0, "comm_interference_net": 0.0,
                                       "comm_interference_p2p": 0.0})
    grid = RankGrid(LayoutConfig(pp=p, dp=8 // p))
    return Engine(progs, grid, Topology(cl), gpu, symmetric=symmetric)


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (4, 16), (8, 8), (2, 1)])
def test_pipeline_step_closed_form(kind: str, p: int, m: int) -> None:
    res = _engine(_programs(kind, p, m, 1), p).run()
    assert res.step_time_s == pytest.approx((m + p - 1) * (TF + TB), abs=HOP_SLACK)
    assert res.step_time_s >= (m + p - 1) * (TF + TB)
    first = res.stats[res.ranks[0]]
    assert first.bubble_s == pytest.approx((p - 1) * (TF + TB), abs=HOP_SLACK)
    assert first.busy["fwd"] == pytest.approx(m * TF)
    assert first.busy["bwd"] == pytest.approx(m * TB)
    frac = first.bubble_s / res.step_time_s
    assert frac == pytest.approx((p - 1) / (m + p - 1), rel=1e-3)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 12, 3), (4, 4, 4), (8, 16, 2)])
def test_interleaved_bubble_shrinks_by_v(p: int, m: int, v: int) -> None:
    res = _engine(_programs("interleaved_1f1b", p, m, v), p).run()
    bubble = (p - 1) / v * (TF + TB)
    assert res.step_time_s == pytest.approx(m * (TF + TB) + bubble, abs=HOP_SLACK)
    assert res.step_time_s >= m * (TF + TB) + bubble
    assert res.stats[res.ranks[0]].bubble_s == pytest.approx(bubble, abs=HOP_SLACK)


def test_full_mode_matches_symmetric_on_hand_built_programs() -> None:
    p, m = 4, 8
    sym = _engine(_programs("1f1b", p, m, 1), p, symmetric=True).run()
    full = _engine(_programs("1f1b", p, m, 1), p, symmetric=False).run()
    assert full.step_time_s == pytest.approx(sym.step_time_s, rel=1e-9)
    assert full.ops_executed == 2 * sym.ops_executed  # dp=2: every stage has two ranks


def test_every_hand_built_op_runs_once() -> None:
    progs = _programs("interleaved_1f1b", 4, 8, 2)
    eng = _engine(progs, 4)
    res = eng.run()
    assert res.ops_executed == sum(len(pr.ops) for pr in progs)
    assert len(res.trace) == res.ops_executed
    seen = defaultdict(int)
    for ev in res.trace:
        seen[(ev.rank, ev.op.idx)] += 1
    assert set(seen.values()) == {1}


# -- through simulate() --------------------------------------------------------------------------

TINY = dict(name="tiny", n_layers=8, hidden=512, n_heads=8, ffn_hidden=2048, activation="gelu",
            norm="layernorm", position="rope", vocab=4096, tied_embeddings=False, linear_bias=False)

SIM_CASES = [
    dict(layout=dict(pp=4, dp=2), train=dict(seq_len=1024, global_batch_seqs=16)),
    dict(layout=dict(pp=2, dp=2, tp=2, vpp=2, sequence_parallel=True, zero_stage=1),
         train=dict(seq_len=1024, global_batch_seqs=8)),
    dict(layout=dict(pp=2, dp=4, fsdp="full", recompute="full"), train=dict(seq_len=512, global_batch_seqs=16)),
    dict(layout=dict(pp=1, dp=4, tp=2, zero_stage=2, tp_comm_overlap=True), train=dict(seq_len=512,
                                                                                      global_batch_seqs=8)),
    dict(layout=dict(pp=2, dp=4, schedule="gpipe", zero_stage=3, overlap_grad_reduce=False),
         train=dict(seq_len=512, global_batch_seqs=8)),
    dict(layout=dict(dp=8, fsdp="full", offload_activation_layers=6), train=dict(seq_len=1024, global_batch_seqs=16)),
]


def _cfg(case: dict) -> dict:
    return dict(model=TINY, hardware=dict(n_nodes=1), **case)


@pytest.mark.parametrize("mode", ["symmetric", "full"])
@pytest.mark.parametrize("case", SIM_CASES, ids=lambda c: str(c["layout"]))
def test_simulate_runs_every_op_once_and_f_before_b(case: dict, mode: str) -> None:
    cfg = _cfg(case)
    run = load_config(cfg)
    cl = cluster_of(run)
    lowered = lower(run, ComputeCostModel(cl.gpu, run.train.precision), cl.node.host_link_Bps)
    res = simulate(cfg, mode=mode, trace=True)
    per_stage = [len(pr.ops) for pr in lowered.programs]
    ranks_per_stage = 1 if mode == "symmetric" else run.layout.world_size // run.layout.pp
    assert res.ops_executed == ranks_per_stage * sum(per_stage)
    assert len(res.trace) == res.ops_executed
    seen = defaultdict(int)
    for ev in res.trace:
        seen[(ev.rank, ev.op.idx)] += 1
        assert ev.end_s >= ev.start_s >= 0.0
        assert ev.end_s <= res.step_time_s * (1 + 1e-12)
    assert set(seen.values()) == {1}
    assert len({r for r, _ in seen}) == ranks_per_stage * run.layout.pp
    # per rank and (micro-batch, chunk): every forward compute ends before any backward starts
    fwd_end: dict[tuple, float] = defaultdict(float)
    bwd_start: dict[tuple, float] = defaultdict(lambda: float("inf"))
    for ev in res.trace:
        if ev.stream != "compute" or ev.op.microbatch < 0:
            continue
        key = (ev.rank, ev.op.microbatch, ev.op.chunk)
        if ev.category == "fwd":
            fwd_end[key] = max(fwd_end[key], ev.end_s)
        elif ev.category in ("bwd", "recompute"):
            bwd_start[key] = min(bwd_start[key], ev.start_s)
    assert fwd_end and set(fwd_end) == set(bwd_start)
    for key, t in fwd_end.items():
        assert t <= bwd_start[key] + 1e-12
    # compute ops of one rank never overlap (one compute stream)
    by_rank = defaultdict(list)
    for ev in res.trace:
        if ev.stream == "compute":
            by_rank[ev.rank].append((ev.start_s, ev.end_s))
    for spans in by_rank.values():
        spans.sort()
        for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
            assert s1 >= e0 - 1e-12


def test_simulated_1f1b_bubble_fraction() -> None:
    model = dict(TINY, n_layers=16, hidden=2048, n_heads=16, ffn_hidden=8192, vocab=1024)
    p, m = 4, 16
    res = simulate(dict(model=model, layout=dict(pp=p, dp=2), train=dict(seq_len=4096, global_batch_seqs=2 * m)))
    frac = res.breakdown_s["bubble"] / res.step_time_s
    # embedding and LM head make the end stages slightly heavier than the middle ones
    assert frac == pytest.approx((p - 1) / (m + p - 1), rel=0.10)


def test_breakdown_sums_to_step() -> None:
    res = simulate(_cfg(SIM_CASES[0]))
    bd = res.breakdown_s
    total = (bd["compute"] + bd["bubble"] + bd["stage_imbalance"] + bd["optimizer"] + bd["other"]
             + sum(bd["exposed_comm"].values()))
    assert total == pytest.approx(res.step_time_s, rel=1e-6)


@pytest.mark.parametrize("slow", [None, 1, 2])
def test_stage_imbalance_is_the_slowest_stage_extra_compute(slow: int | None) -> None:
    """1F1B, p = 4, m = 8, one stage's ops 1.5x longer: in the steady state every stage runs at the
    slowest one's pace, so stage 0 waits m x 0.5 x (TF + TB) = 12 s more than the fill and drain; the
    breakdown calls that ``stage_imbalance`` and leaves the rest of its input waits as ``bubble``
    (balanced: no imbalance, bubble = (p - 1)(TF + TB))."""
    from simtrain.studies.simulate import _breakdown, _compute_s

    p, m = 4, 8
    progs = _programs("1f1b", p, m, 1)
    if slow is not None:
        for op in progs[slow].ops:
            if op.kind == OpKind.COMPUTE:
                op.duration_s *= 1.5
    res = _engine(progs, p).run()
    first = res.stats[res.ranks[0]]
    bd = _breakdown(first, res.step_time_s, max(_compute_s(res.stats[r]) for r in res.ranks))
    extra = 0.0 if slow is None else m * 0.5 * (TF + TB)
    assert bd["stage_imbalance"] == pytest.approx(extra)
    assert bd["bubble"] + bd["stage_imbalance"] == pytest.approx(first.bubble_s)
    assert 0.0 < bd["bubble"] <= (p - 1) * (TF + TB) + HOP_SLACK
    if slow is None:
        assert bd["bubble"] == pytest.approx((p - 1) * (TF + TB), abs=HOP_SLACK)
    assert res.step_time_s == pytest.approx(m * (TF + TB) + extra + bd["bubble"], abs=HOP_SLACK)


def test_interference_per_link_class() -> None:
    """Collectives hold NCCL's channel SMs (16 for a DGX node's inter-node rings, nccl#689); a
    pipeline send/recv holds one small CTA (nccl#1433), so it slows compute by one SM's share."""
    from simtrain.engine.axes import _interference
    from simtrain.engine.comm_planner import P2P_CLASS
    from simtrain.hardware.load import load_gpu

    for name in ("a100-80gb", "h100-sxm", "h200", "b200"):
        gpu = load_gpu(name)
        assert _interference(gpu, "net") == pytest.approx(16 / gpu.sm_count, abs=0.006)
        assert _interference(gpu, "nvlink") == gpu.comm_interference_nvlink
        assert _interference(gpu, P2P_CLASS) == pytest.approx(1 / gpu.sm_count)
        assert _interference(gpu.model_copy(update={"comm_interference_p2p": 0.0}), P2P_CLASS) == 0.0


def _in_situ_programs(work_b: float) -> list[Program]:
    """One stage: compute A (1 s), then a DP all-reduce (after A) on its stream beside compute B
    (``work_b`` s alone)."""
    p0 = Program(0)
    a = p0.add(OpKind.COMPUTE, Stream.COMPUTE, "A", duration_s=1.0)
    p0.add(OpKind.COLLECTIVE, Stream.DP, "ar", category="comm", deps=(a.idx,), coll=ALL_REDUCE, axis="dp",
           comm_bytes=40e9)
    if work_b > 0:
        p0.add(OpKind.COMPUTE, Stream.COMPUTE, "B", duration_s=work_b)
    return [p0]


@pytest.mark.parametrize("symmetric", [True, False])
def test_collectives_beside_compute_take_the_in_situ_slowdown_longer(symmetric: bool) -> None:
    """GpuSpec.comm_in_situ_slowdown f (a CPU profile's gloo beside busy cores, measured as the all-reduce's
    time beside GEMMs over its time alone): a collective on a comm stream lasts its transfer T plus f x
    the compute that ran beside it. B longer than T: (1 + f) T; B = T / 4 ending inside it: T + f T / 4;
    no compute beside it (the all-reduce after the backward, before the optimizer): T. Compute is not
    slowed here (interference 0), so B's own times are exact."""
    cl = build_cluster("dgx-h100", 1)
    quiet = {"comm_interference_nvlink": 0.0, "comm_interference_net": 0.0, "comm_interference_p2p": 0.0}
    f = 0.5

    def span(work_b: float, slowdown: float) -> dict[str, tuple[float, float]]:
        gpu = cl.gpu.model_copy(update={**quiet, "comm_in_situ_slowdown": slowdown})
        eng = Engine(_in_situ_programs(work_b), RankGrid(LayoutConfig(dp=8)), Topology(cl), gpu,
                     symmetric=symmetric)
        eng.run()
        rank0 = min(eng.ranks)
        return {e.name: (e.start_s, e.end_s) for e in eng.trace if e.rank == rank0}

    ar0, ar1 = span(0.0, 0.0)["ar"]
    transfer = ar1 - ar0
    assert ar0 == pytest.approx(1.0) and transfer > 0.1
    for work_b, beside in ((4.0 * transfer, transfer), (transfer / 4.0, transfer / 4.0), (0.0, 0.0)):
        got = span(work_b, f)
        a0, a1 = got["ar"]
        assert a0 == pytest.approx(1.0) and a1 - a0 == pytest.approx(transfer + f * beside, rel=1e-12)
        if work_b > 0:
            assert got["B"] == pytest.approx((1.0, 1.0 + work_b), rel=1e-12)


def _overlap_programs(dp_bytes: float, send_bytes: float, work_b: float) -> list[Program]:
    """Stage 0: compute A (1 s), then compute B (``work_b`` s alone) while a DP all-reduce (after A)
    and then a pipeline send (after the all-reduce) run on their streams; stage 1 receives."""
    p0, p1 = Program(0), Program(1)
    a = p0.add(OpKind.COMPUTE, Stream.COMPUTE, "A", duration_s=1.0)
    ar = p0.add(OpKind.COLLECTIVE, Stream.DP, "ar", category="comm", deps=(a.idx,), coll=ALL_REDUCE,
                axis="dp", comm_bytes=dp_bytes)
    send = p0.add(OpKind.SEND, Stream.PP, "send", category="comm", deps=(ar.idx,), coll=SEND, axis="pp",
                  comm_bytes=send_bytes, peer_stage=1)
    p0.add(OpKind.COMPUTE, Stream.COMPUTE, "B", duration_s=work_b)
    p1.add(OpKind.COMPUTE, Stream.COMPUTE, "C", duration_s=0.1, remote=(0, send.idx))
    return [p0, p1]


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("work_b", [2.0, 0.05])
def test_compute_slows_only_while_a_collective_overlaps_it(symmetric: bool, work_b: float) -> None:
    """Rate-based interference: compute runs at 1 / (1 + i) while a collective of interference i is in
    flight and at full rate otherwise, re-timed when one starts or ends. B (2 s alone) starts with a
    DP all-reduce (i = 0.5) that is followed by a send (i = 0.25), both ending inside B: B ends at
    1 + d_ar + d_send + (2 - d_ar / 1.5 - d_send / 1.25). A 0.05 s B ends inside the all-reduce and
    takes 0.05 x 1.5."""
    cl = build_cluster("dgx-h100", 1)
    gpu = cl.gpu.model_copy(update={"comm_interference_nvlink": 0.5, "comm_interference_net": 0.5,
                                       "comm_interference_p2p": 0.25})
    eng = Engine(_overlap_programs(40e9, 40e9, work_b), RankGrid(LayoutConfig(pp=2, dp=4)), Topology(cl), gpu,
                 symmetric=symmetric)
    eng.run()
    rank0 = min(eng.ranks)
    span = {e.name: (e.start_s, e.end_s) for e in eng.trace if e.rank == rank0}
    (ar0, ar1), (s0, s1), (b0, b1) = span["ar"], span["send"], span["B"]
    assert b0 == pytest.approx(1.0) and ar0 == pytest.approx(1.0) and s0 == pytest.approx(ar1)
    d_ar, d_send = ar1 - ar0, s1 - s0
    assert d_ar > 0.05 and d_ar + d_send < 1.0  # both within B when it is 2 s long
    if work_b == 2.0:
        expected = 1.0 + d_ar + d_send + (work_b - d_ar / 1.5 - d_send / 1.25)
    else:
        expected = 1.0 + work_b * 1.5
    assert b1 == pytest.approx(expected, rel=1e-12)
    assert eng.stats[rank0].busy["fwd"] == pytest.approx(1.0 + (b1 - b0), rel=1e-12)
