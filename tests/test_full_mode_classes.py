"""Full mode by classes of alike ranks (``simtrain.engine.merge``, issue 28 part 5) against full mode
simulating every rank: the same step, per-rank ends, busy times, FLOPs and memory peaks (to 1e-9), with
and without a slow GPU or a slow node, on dense, pipelined (1F1B, interleaved), ZeRO-3 and MoE/EP
layouts of 64 and 256 GPUs; and the fallback to every rank where members of a class turn out to differ."""

from __future__ import annotations

from typing import Any

import pytest

from simtrain.engine import engine as engine_mod
from simtrain.engine.engine import Engine
from simtrain.engine.merge import rank_classes
from simtrain.engine.records import EngineResult
from simtrain.lower.ops import OpKind, Program, Stream
from simtrain.plan.layout import RankGrid
from simtrain.spec.collective_kinds import ALL_REDUCE, SEND
from simtrain.spec.config import LayoutConfig
from simtrain.studies.simulate import simulate

TINY = dict(name="tiny", n_layers=8, hidden=512, n_heads=8, n_kv_heads=4, ffn_hidden=1024,
            activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False,
            linear_bias=False)
REL = 1e-9

CASES: dict[str, tuple[Any, int, dict[str, Any], int]] = {  # model, nodes (8 GPUs each), layout, sequences
    "dense-tp2-dp32": (TINY, 8, dict(tp=2, dp=32, zero_stage=1), 64),
    "1f1b-tp2-pp4-dp8": (TINY, 8, dict(tp=2, pp=4, dp=8, zero_stage=1), 64),
    "interleaved-tp2-pp4-vpp2-dp8": (TINY, 8, dict(tp=2, pp=4, vpp=2, dp=8), 64),
    "zero3-tp2-pp2-dp16": (TINY, 8, dict(tp=2, pp=2, dp=16, zero_stage=3), 32),
    "moe-tp2-pp2-dp16-ep8": ({"preset": "mixtral-8x7b", "n_layers": 4}, 8, dict(tp=2, pp=2, dp=16, ep=8, sequence_parallel=True), 32),
    "256-tp8-pp4-dp8": (TINY, 32, dict(tp=8, pp=4, dp=8, zero_stage=1), 64),
}

WHATIFS = {
    "slow-gpu": 'whatif.slow_gpus={"node3/gpu5": 0.9}',
    "slow-node": 'whatif.slow_nodes={"node2": 0.8}',
}


def _cfg(model: Any, n_nodes: int, layout: dict[str, Any], seqs: int) -> dict[str, Any]:
    return dict(name="classes", model=model, hardware=dict(node="dgx-h100", n_nodes=n_nodes), layout=layout,
                train=dict(seq_len=1024, global_batch_seqs=seqs), sim=dict(steady_state=False))


def _simulate(monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any], over: list[str], merge: bool
              ) -> tuple[Any, list[tuple[EngineResult, int]]]:
    """simulate() in full mode with or without classes; every engine run's result and its simulated ranks."""
    runs: list[tuple[EngineResult, int]] = []
    run = Engine.run

    def recording(self: Engine) -> EngineResult:
        simulated = len(self.ranks)
        res = run(self)
        runs.append((res, simulated))
        return res

    with monkeypatch.context() as m:
        m.setattr(engine_mod, "MERGE", merge)
        m.setattr(Engine, "run", recording)
        return simulate(cfg, over, mode="full"), runs


def _same(a: EngineResult, b: EngineResult) -> None:
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=REL)
    assert b.ranks == a.ranks and b.ops_executed == a.ops_executed
    tol = REL * a.step_time_s
    for r in a.ranks:
        x, y = a.stats[r], b.stats[r]
        assert y.end_s == pytest.approx(x.end_s, rel=0, abs=tol), r
        assert y.last_compute_end_s == pytest.approx(x.last_compute_end_s, rel=0, abs=tol), r
        assert y.flops == pytest.approx(x.flops, rel=REL), r
        assert y.bubble_s == pytest.approx(x.bubble_s, rel=0, abs=tol), r
        for k in set(x.busy) | set(y.busy):
            assert y.busy[k] == pytest.approx(x.busy[k], rel=0, abs=tol), (r, k)
        for k in set(x.exposed) | set(y.exposed):
            assert y.exposed[k] == pytest.approx(x.exposed[k], rel=0, abs=tol), (r, k)
        assert b.ledgers[r].peak == pytest.approx(a.ledgers[r].peak, rel=REL), r


@pytest.mark.parametrize("whatif", list(WHATIFS))
@pytest.mark.parametrize("case", list(CASES))
def test_classes_match_every_rank(monkeypatch: pytest.MonkeyPatch, case: str, whatif: str) -> None:
    """The what-if runs the step twice (unperturbed and perturbed): both runs, by classes, equal the
    every-rank runs rank by rank, and simulate far fewer ranks."""
    cfg = _cfg(*CASES[case])
    every, ref = _simulate(monkeypatch, cfg, [WHATIFS[whatif]], merge=False)
    merged, got = _simulate(monkeypatch, cfg, [WHATIFS[whatif]], merge=True)
    assert len(ref) == len(got) == 2
    assert not any("simulated every rank" in n for n in merged.notes)
    world = every.n_gpus
    for (a, n_ref), (b, n_got) in zip(ref, got, strict=True):
        assert n_ref == world and n_got <= world // 4
        _same(a, b)
    assert merged.step_time_s == pytest.approx(every.step_time_s, rel=REL)
    for x, y in zip(every.memory, merged.memory, strict=True):
        assert y.peak_bytes == pytest.approx(x.peak_bytes, rel=REL)
    assert merged.whatif is not None and every.whatif is not None
    for k in ("critical_rank", "bottleneck_rank", "baseline_critical_rank", "baseline_bottleneck_rank"):
        assert merged.whatif[k] == every.whatif[k], k


def test_a_slow_link_some_groups_cross_falls_back_to_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow NIC slows the data-parallel rings that cross it, not their class mates on other nodes'
    rails: the check at the transfers' ends catches it, the engine simulates every rank and says so, and
    the result is the every-rank one."""
    cfg = _cfg(TINY, 8, dict(tp=2, dp=32, zero_stage=1), 64)
    over = ['whatif.slow_links={"nic3.0": 0.5}']
    every, _ = _simulate(monkeypatch, cfg, over, merge=False)
    merged, runs = _simulate(monkeypatch, cfg, over, merge=True)
    assert any("full mode simulated every rank" in n for n in merged.notes)
    # the perturbed run comes first: its every-rank rerun ends before the merged try (one class) that
    # handed over to it; then the unperturbed run, by classes (one class: every rank alike)
    assert [n for _, n in runs] == [64, 1, 1]
    assert merged.step_time_s == every.step_time_s  # the perturbed run: every rank simulated, as before
    assert merged.whatif is not None and every.whatif is not None
    assert merged.whatif["baseline_step_time_s"] == pytest.approx(every.whatif["baseline_step_time_s"], rel=REL)


def test_rank_classes_of_one_slow_gpu_in_data_parallelism() -> None:
    """dp=8, one all-reduce: the slow rank is a class of its own, its peers another (each group holds
    one slow rank and seven others); tp=2 x dp=4 with rank 5 slow: rank 5, its TP peer 4, the DP peers
    of 5 (1, 3, 7) and those of 4 (0, 2, 6)."""
    p = Program(0)
    b = p.add(OpKind.COMPUTE, Stream.COMPUTE, "B", category="bwd", duration_s=1.0)
    p.add(OpKind.COLLECTIVE, Stream.DP, "ar", category="comm", deps=(b.idx,), coll=ALL_REDUCE, axis="dp",
          comm_bytes=1e6)
    p.add(OpKind.COLLECTIVE, Stream.COMPUTE, "tp", category="comm", coll=ALL_REDUCE, axis="tp", comm_bytes=1e6)
    dp = rank_classes(RankGrid(LayoutConfig(dp=8)), [p], {5: 0.9}, {})
    assert dp.members == {0: [0, 1, 2, 3, 4, 6, 7], 5: [5]}
    mixed = rank_classes(RankGrid(LayoutConfig(tp=2, dp=4)), [p], {5: 0.9}, {})
    assert sorted(mixed.members.values()) == [[0, 2, 6], [1, 3, 7], [4], [5]]
    assert mixed.rendezvous("dp", 1)[1] == 2 and mixed.rendezvous("tp", 5)[1] == 2  # classes, not ranks


def _pipeline_programs(pp: int) -> list[Program]:
    """Per stage: a TP all-reduce, a send to the next stage, a compute op reading the previous stage's
    send, the DP all-reduce: the group and pipeline structure classes are made from."""
    progs = [Program(s) for s in range(pp)]
    sends = {}
    for s, p in enumerate(progs):
        p.add(OpKind.COLLECTIVE, Stream.COMPUTE, "tp", category="comm", coll=ALL_REDUCE, axis="tp", comm_bytes=1e6)
        if s + 1 < pp:
            sends[s] = p.add(OpKind.SEND, Stream.PP, "send", category="comm", coll=SEND, axis="pp",
                             comm_bytes=1e6, peer_stage=s + 1)
    for s, p in enumerate(progs):
        if s > 0:
            p.add(OpKind.COMPUTE, Stream.COMPUTE, "C", duration_s=1e-6, remote=(s - 1, sends[s - 1].idx))
        p.add(OpKind.COLLECTIVE, Stream.DP, "dp", category="comm", coll=ALL_REDUCE, axis="dp", comm_bytes=1e6)
    return progs


def test_one_slow_gpu_among_1024_leaves_four_classes_per_stage() -> None:
    """GPT-3's layout on 1,024 GPUs (TP8 x PP8 x DP16): unperturbed, one class per stage; one slow GPU
    splits each stage by whether a rank is in the slow GPU's data-parallel replica (its pipeline) and on
    its TP index (its DP groups and their pipeline peers): 32 simulated ranks instead of 1,024, however
    large DP grows."""
    grid = RankGrid(LayoutConfig(tp=8, pp=8, dp=16))
    progs = _pipeline_programs(8)
    assert len(rank_classes(grid, progs, {}, {}).members) == 8
    slow = 8 * 16 * 3 + 8 * 5 + 2  # stage 3, replica 5, TP index 2
    classes = rank_classes(grid, progs, {slow: 0.85}, {})
    assert len(classes.members) == 32
    assert classes.members[slow] == [slow]
    assert len(rank_classes(RankGrid(LayoutConfig(tp=8, pp=8, dp=128)), progs, {slow: 0.85}, {}).members) == 32
