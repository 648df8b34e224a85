"""Issue 31, simulator core: DualPipe's closed-form memory, bounded simulation memory, the NVL72
speed cliff, exposed-communication attribution and the result invariants ``simulate`` checks."""

from __future__ import annotations

from typing import Any

import pytest

from simtrain.studies.simulate import simulate


def _small(preset: str, n_layers: int, n_nodes: int, seqs: int) -> dict[str, Any]:
    return {"name": "robust", "model": {"preset": preset, "n_layers": n_layers},
            "hardware": {"node": "dgx-h100", "n_nodes": n_nodes}, "layout": {},
            "train": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_seqs": seqs}}


@pytest.mark.parametrize("kind", ["dualpipe", "dualpipev"])
@pytest.mark.parametrize(("preset", "pp", "extra"), [
    ("llama3-8b", 4, ["layout.tp=2", "layout.dp=2"]),
    ("llama3-8b", 8, ["layout.tp=2", "layout.dp=1"]),
    ("deepseek-v3", 4, ["layout.dp=8", "layout.ep=8"]),
    ("deepseek-v3", 2, ["layout.dp=16", "layout.ep=8", "layout.recompute=full"]),
])
def test_dualpipe_closed_form_peak_equals_the_ledger(kind: str, preset: str, pp: int, extra: list[str]) -> None:
    """DualPipe(V)'s overlapped F&B pair interleaves its two chains one compute segment at a time; a
    layer of several segments (TP collectives, EP all-to-alls between them) allocates on its first and
    frees on its last, so the closed form walks the pair step by step too and equals the ledger's peak
    (it paired whole layers before: 1.6-2.7 % low, or 0.7 % high under full recompute)."""
    n_nodes = 4 if preset == "deepseek-v3" else 2
    cfg = _small(preset, 16, n_nodes, 8 * pp * (16 if preset == "deepseek-v3" else 2))
    r = simulate(cfg, [f"layout.schedule={kind}", f"layout.pp={pp}", *extra])
    for m in r.memory:
        assert m.closed_form_peak_bytes == pytest.approx(m.peak_bytes, rel=1e-9)


def test_turning_dp_overlap_off_moves_the_added_time_into_exposed_dp() -> None:
    """GPT-3's tied embedding all-reduce queues behind the gradient reduction on the data-parallel
    stream; the optimizer waits for both. Without overlap the whole reduction runs after the last
    backward: the step grows by about the reduction's time, and that time is exposed dp, not pp (the
    awaited all-reduce's axis, which took it all before)."""
    cfg = {"name": "gpt3-tied", "model": {"preset": "gpt3-175b", "vocab": 51200, "n_layers": 8},
           "hardware": {"node": "dgx-a100", "n_nodes": 8},
           "layout": {"tp": 8, "pp": 4, "vpp": 2, "dp": 2, "recompute": "full"},
           "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 32}}
    on = simulate(cfg, ["layout.overlap_grad_reduce=true"])
    off = simulate(cfg, ["layout.overlap_grad_reduce=false"])
    added = off.step_time_s - on.step_time_s
    dp_on, dp_off = on.breakdown_s["exposed_comm"]["dp"], off.breakdown_s["exposed_comm"]["dp"]
    pp_on, pp_off = on.breakdown_s["exposed_comm"]["pp"], off.breakdown_s["exposed_comm"]["pp"]
    assert added > 0.01 * on.step_time_s
    assert dp_off - dp_on > 0.9 * added
    assert pp_off < pp_on + 0.1 * added


SMALL = _small("llama3-8b", 4, 1, 16)


def test_every_example_meets_the_invariants() -> None:
    """``simulate`` checks its result (``simtrain.engine.invariants``); a small run passes with margin."""
    from simtrain.engine import invariants
    r = simulate(SMALL, ["layout.pp=2", "layout.dp=4"])
    assert invariants.violations(r, 1.0) == []
    assert r.hfu >= r.mfu
    assert all(m.closed_form_peak_bytes == pytest.approx(m.peak_bytes, rel=1e-9) for m in r.memory)


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("mfu", 1.5, "MFU"),
    ("hfu", 0.01, "HFU"),
    ("step_time_s", float("nan"), "step time"),
    ("breakdown_s", None, "breakdown adds up"),
    ("memory", None, "closed-form peak"),
    ("components", None, "negative memory"),
])
def test_a_result_breaking_an_invariant_is_refused(field: str, value: Any, needle: str) -> None:
    from dataclasses import replace

    from simtrain.engine import invariants
    r = simulate(SMALL, ["layout.pp=2", "layout.dp=4"])
    if field == "breakdown_s":
        bd = dict(r.breakdown_s, compute=r.breakdown_s["compute"] + 0.5 * r.step_time_s)
        bad = replace(r, breakdown_s=bd)
    elif field == "memory":
        bad = replace(r, memory=[replace(r.memory[0], closed_form_peak_bytes=0.5 * r.memory[0].peak_bytes)])
    elif field == "components":
        bad = replace(r, memory=[replace(r.memory[0], components={"activations": -1e9})])
    else:
        bad = replace(r, **{field: value})
    found = invariants.violations(bad, 1.0)
    assert any(needle in v for v in found), found
    from simtrain.spec.errors import SimulationInvariantError
    with pytest.raises(SimulationInvariantError, match="robust") as exc:
        invariants.check(bad, type("G", (), {"fp8_flops_per_s": 0.0, "bf16_flops_per_s": 1.0})(), "bf16")
    assert exc.value.config == "robust"


def test_fp8_runs_may_exceed_the_bf16_peak_but_not_the_fp8_one() -> None:
    from simtrain.engine import invariants
    from simtrain.hardware.load import load_gpu
    gpu = load_gpu("h100-sxm")
    assert invariants.peak_ratio(gpu, "bf16") == 1.0
    assert invariants.peak_ratio(gpu, "fp8") == pytest.approx(gpu.fp8_flops_per_s / gpu.bf16_flops_per_s)


def test_simulate_raises_and_the_cli_exits_3_on_a_broken_result(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A simulator bug (here: a breakdown that loses half the compute) is an internal error naming the
    config, exit code 3 (2 is bad input), never an answer."""
    import importlib

    import yaml

    sim = importlib.import_module("simtrain.studies.simulate")
    from simtrain.cli.main import main
    from simtrain.spec.errors import SimulationInvariantError
    real = sim._breakdown

    def broken(*args: Any) -> dict[str, Any]:
        out = real(*args)
        out["compute"] *= 0.5
        return out

    monkeypatch.setattr(sim, "_breakdown", broken)
    with pytest.raises(SimulationInvariantError, match="breakdown adds up"):
        simulate(SMALL, ["layout.pp=2", "layout.dp=4"])
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    assert main(["simulate", str(path), "--set", "layout.pp=2", "--set", "layout.dp=4"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "robust" in err and "Traceback" not in err


def _traced_peak(cfg: dict[str, Any]) -> tuple[int, Any]:
    import tracemalloc
    tracemalloc.start()
    try:
        r = simulate(cfg)
        return tracemalloc.get_traced_memory()[1], r
    finally:
        tracemalloc.stop()


def test_steady_state_memory_does_not_grow_with_the_micro_batch_count() -> None:
    """Under the steady-state shortcut the short runs are the same for 64 and 4,096 micro-batches and
    the extended memory timeline stores its repeating period once (``steady.PeriodicTimeline``): the
    simulation's peak Python allocation (tracemalloc) is the same (measured: 0.47 MiB both; it was
    0.47 vs 5.75 MiB, the 20,481-point timeline), while the timeline still has every point."""
    def cfg(m: int) -> dict[str, Any]:
        return {"name": "mem", "model": {"preset": "llama3-8b", "n_layers": 4},
                "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"pp": 4, "dp": 2},
                "train": {"seq_len": 1024, "micro_batch_size": 1, "global_batch_seqs": 2 * m}}
    simulate(cfg(16))  # warm the caches (profiles, plans) outside the measurement
    small, r64 = _traced_peak(cfg(64))
    big, r4k = _traced_peak(cfg(4096))
    assert "steady state" in r4k.notes[0] and r4k.microbatches == 4096
    assert big < 1.5 * small
    t4k = r4k.memory[0].timeline
    assert t4k.k == 1020  # periods of 4 micro-batches added to the last short run (16)
    assert len(t4k) == len(t4k.head) + 1020 * len(t4k.period) + len(t4k.tail) > 4096
    points = list(t4k)
    assert len(points) == len(t4k) and points[-1] == t4k[-1] and points[len(points) // 2] == t4k[len(points) // 2]
    assert max(v for _, v in points) == pytest.approx(r4k.memory[0].peak_bytes / 1.05, rel=1e-9)
    assert len(r64.memory[0].timeline) < len(t4k)
    assert r4k.to_dict(timeline=True)["memory"][0]["timeline"] == points


def test_steady_short_runs_are_capped() -> None:
    """The short runs stop after ``MAX_SHORT_RUNS`` whatever the micro-batch count (their largest, hence
    the shortcut's time and memory, is bounded)."""
    from simtrain.engine.steady import MAX_SHORT_RUNS, plan
    steady = plan("1f1b", 8, 10**9)
    assert steady is not None
    counts = list(steady.counts())
    assert len(counts) == MAX_SHORT_RUNS and counts[-1] == counts[0] + (MAX_SHORT_RUNS - 1) * 8


def test_rank_grid_groups_are_memoised_partitions() -> None:
    """Full mode looks a group up per rank and op: ``RankGrid.group`` computes each group once and
    hands every member the same tuple (the NVL72 case's 2,304 ranks recomputed a 288-rank dp x cp
    plane per lookup)."""
    from simtrain.plan.layout import RankGrid
    from simtrain.plan.load import load_config
    run = load_config(_small("mixtral-8x7b", 4, 4, 64), ["layout.tp=2", "layout.cp=2", "layout.dp=8",
                                                          "layout.ep=4", "layout.sequence_parallel=true"])
    grid = RankGrid(run.layout)
    for axis in ("tp", "cp", "dp", "dp_cp", "ep", "edp", "etp"):
        seen: set[int] = set()
        for r in range(grid.world_size):
            g = grid.group(axis, r)
            assert r in g and all(grid.group(axis, x) is g for x in g)
            seen.update(g)
        assert seen == set(range(grid.world_size))
