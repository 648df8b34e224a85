"""GPU-to-GPU speed variability (``sim.variability``): seeded draws, their closed forms, and bad input.

Closed forms: the draws' mean and spread; the slowest of n GPUs against the normal distribution's order
statistic; a symmetric-mode draw against ``whatif.slow_nodes`` at the drawn slowest speed (the same step, to
the bit); full mode's per-GPU draw against it too (pure data parallelism waits for its slowest GPU).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import numpy as np
import pytest
from test_whatif import _SMALL as WHATIF_SMALL

from simtrain.plan.layout import RankGrid
from simtrain.spec.config import LayoutConfig
from simtrain.spec.errors import ConfigError
from simtrain.spec.variability_spec import VariabilitySpec
from simtrain.studies.simulate import simulate
from simtrain.studies.sweep import sweep
from simtrain.studies.variability import SPEED_FLOOR, draw_speeds, rank_speeds, summary, summary_lines

_SMALL = {**WHATIF_SMALL, "name": "variability-small"}  # Llama 3 8B cut to 4 layers, DP 8 on one DGX H100
_PIPELINE = {**_SMALL, "name": "variability-pp", "hardware": {"node": "dgx-h100", "n_nodes": 2},
             "layout": {"pp": 2, "dp": 8}, "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 32}}


def _var(cv: float, samples: int, seed: int = 0) -> list[str]:
    return [f"sim.variability.gpu_speed_cv={cv}", f"sim.variability.samples={samples}", f"sim.seed={seed}"]


def test_draws_have_the_asked_mean_and_spread_and_the_floor() -> None:
    speeds = draw_speeds(np.random.default_rng(1), 200_000, 0.03)
    assert speeds.mean() == pytest.approx(1.0, abs=3 * 0.03 / np.sqrt(200_000))
    assert speeds.std() == pytest.approx(0.03, rel=0.01)
    assert draw_speeds(np.random.default_rng(1), 200_000, 0.2).min() >= SPEED_FLOOR


def test_slowest_of_n_gpus_follows_the_normal_order_statistic() -> None:
    """The median of the slowest of n draws is 1 + cv * Phi^-1(1 - 2^(-1/n)) (P(min <= x) = 1 - (1 - F(x))^n)."""
    rng, n, cv = np.random.default_rng(7), 1024, 0.02
    slowest = [draw_speeds(rng, n, cv).min() for _ in range(400)]
    expected = 1.0 + cv * statistics.NormalDist().inv_cdf(1.0 - 0.5 ** (1.0 / n))
    assert statistics.median(slowest) == pytest.approx(expected, abs=0.002)  # 0.936 for n 1024, cv 2 %


def test_rank_speeds_symmetric_takes_each_stages_slowest_and_full_mode_each_gpus_own() -> None:
    grid = RankGrid(LayoutConfig(pp=2, dp=4))
    speeds = np.array([1.0, 0.97, 1.02, 0.99, 1.01, 1.03, 0.95, 1.0])
    stage = [grid.stage_of(r) for r in range(8)]
    reps = [[grid.representative(0), grid.representative(1)]]
    got = rank_speeds(grid, speeds, True, reps)
    assert got == {reps[0][s]: min(float(v) for v, st in zip(speeds, stage, strict=True) if st == s) for s in (0, 1)}
    assert rank_speeds(grid, speeds, False, reps) == {r: float(speeds[r]) for r in range(8)}


def test_a_symmetric_draw_is_the_step_with_every_gpu_at_the_drawn_slowest_speed() -> None:
    """pp 1: the representative runs at the world's slowest draw, which is ``whatif.slow_nodes`` at that speed
    (full mode); full mode's own draw (each GPU its speed) gives the same step: the all-reduce waits for the
    slowest GPU."""
    seed, cv = 3, 0.05
    slowest = float(draw_speeds(np.random.default_rng(seed), 8, cv).min())
    assert slowest < 1.0
    sym = simulate(_SMALL, _var(cv, 1, seed))
    assert sym.variability is not None and sym.variability["slowest_gpu_speed_p50"] == slowest
    perturbed = simulate(_SMALL, ["whatif.slow_nodes={node0: " + repr(slowest) + "}"])
    assert sym.variability["step_time_s"]["p50"] == perturbed.step_time_s
    full = simulate(_SMALL, _var(cv, 1, seed), mode="full")
    assert full.variability is not None and full.variability["step_time_s"]["p50"] == perturbed.step_time_s


def test_nominal_step_is_unchanged_and_draws_are_seeded() -> None:
    nominal = simulate(_PIPELINE)
    a = simulate(_PIPELINE, _var(0.03, 6, seed=11))
    b = simulate(_PIPELINE, _var(0.03, 6, seed=11))
    c = simulate(_PIPELINE, _var(0.03, 6, seed=12))
    assert a.step_time_s == nominal.step_time_s and a.breakdown_s == nominal.breakdown_s
    assert a.variability == b.variability and json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    assert c.variability != a.variability
    v = a.variability
    assert v is not None and v["nominal_step_time_s"] == nominal.step_time_s and v["samples"] == 6
    st = v["step_time_s"]
    assert st["min"] <= st["p10"] <= st["p50"] <= st["p90"] <= st["max"]
    assert st["p50"] > nominal.step_time_s  # the slowest of 8 GPUs a stage lies below the mean speed


def test_symmetric_mode_is_close_to_full_mode_and_not_below_it() -> None:
    """Under a pipeline, each stage taking its own slowest GPU over-counts a little (module docstring)."""
    sym = simulate(_PIPELINE, _var(0.03, 4, seed=5))
    full = simulate(_PIPELINE, _var(0.03, 4, seed=5), mode="full")
    assert sym.variability is not None and full.variability is not None
    s, f = sym.variability["step_time_s"]["p50"], full.variability["step_time_s"]["p50"]
    assert f * (1 - 1e-9) <= s <= f * 1.02


def test_more_gpus_lose_more_to_their_slowest() -> None:
    small = simulate(_SMALL, _var(0.03, 8, seed=2))
    big = simulate({**_SMALL, "hardware": {"node": "dgx-h100", "n_nodes": 8}, "layout": {"dp": 64},
                    "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 128}}, _var(0.03, 8, seed=2))
    assert small.variability is not None and big.variability is not None
    loss = [v["step_time_s"]["p50"] / v["nominal_step_time_s"] for v in (small.variability, big.variability)]
    assert 1.0 < loss[0] < loss[1]


def test_summary_lines_name_the_percentiles() -> None:
    v = summary(VariabilitySpec(gpu_speed_cv=0.02, samples=3), 0, 10.0, [10.2, 10.4, 10.6], [0.96, 0.95, 0.97])
    assert v["step_time_s"]["p50"] == 10.4 and v["slowest_gpu_speed_p50"] == 0.96
    (line,) = summary_lines(v)
    assert "CV 2.0 %" in line and "10.4000" in line and "+4.00 %" in line
    assert summary_lines(None) == []


def test_a_sweep_carries_the_percentiles_per_point() -> None:
    frame = sweep(_SMALL, ["train.global_batch_seqs=8,16"], overrides=_var(0.03, 3, seed=4), workers=1)
    assert frame["error"].isna().all(), frame["error"].tolist()
    for _, row in frame.iterrows():
        assert row["step_time_s"] < row["step_time_p10_s"] <= row["step_time_p50_s"] <= row["step_time_p90_s"]
    plain = sweep(_SMALL, ["train.global_batch_seqs=8,16"], workers=1)
    assert "step_time_p50_s" not in plain.columns
    assert list(plain["step_time_s"]) == list(frame["step_time_s"])


def test_whole_runs_and_searches_use_the_nominal_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``simtrain run`` and ``simtrain search`` time and rank by the nominal step: no draws (nor their cost)."""
    import simtrain.studies.simulate as sim_module
    from simtrain.studies.run import simulate_run
    from simtrain.studies.search import search
    from simtrain.studies.search_space import SearchSpace

    seen: list[object] = []
    real = sim_module.simulate

    def spy(cfg, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(cfg.sim.variability)
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(sim_module, "simulate", spy)
    run = {**_SMALL, "run": {"tokens": "1Mi"}}
    drawn = {**run, "sim": {"variability": {"gpu_speed_cv": 0.05, "samples": 4}, "seed": 1}}
    assert simulate_run(drawn).time_to_train_s == simulate_run(run).time_to_train_s
    assert seen and all(v is None for v in seen)
    space = SearchSpace(tp=(1, 2), pp=(1,), cp=(1,), micro_batch_size=(1,), zero_stage=(1,))
    found = search({**drawn, "run": None}, space=space, top_k=2, workers=1)
    rows = [c.row for c in found.candidates if c.row]
    assert rows and all("step_time_p50_s" not in r for r in rows)


@pytest.mark.parametrize(("overrides", "path"), [
    (["sim.variability.gpu_speed_cv=0"], "sim.variability.gpu_speed_cv"),
    (["sim.variability.gpu_speed_cv=0.5"], "sim.variability.gpu_speed_cv"),
    (["sim.variability.gpu_speed_cv=0.02", "sim.variability.samples=0"], "sim.variability.samples"),
    (["sim.variability.gpu_speed_cv=0.02", "sim.variability.samples=100000"], "sim.variability.samples"),
    (["sim.variability.samples=4"], "sim.variability.gpu_speed_cv"),
    (["sim.seed=-1"], "sim.seed"),
    (["sim.variability.gpu_speed_cv=0.02", "whatif.slow_gpus={gpu1: 0.9}"], "sim.variability"),
])
def test_bad_variability_input_names_the_field(overrides: list[str], path: str) -> None:
    with pytest.raises(ConfigError) as err:
        simulate(_SMALL, overrides)
    assert any(p.path == path for p in err.value.problems), err.value.problems


def test_cli_prints_the_percentiles_and_exits_2_on_bad_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps(_SMALL))
    cmd = [sys.executable, "-m", "simtrain.cli.main", "simulate", str(cfg), "--set", "sim.variability.gpu_speed_cv=0.02",
           "--set", "sim.variability.samples=3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "variability   GPU speed CV 2.0 %, 3 draws (seed 0)" in out.stdout
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(js.stdout)["variability"]["samples"] == 3
    bad = subprocess.run([*cmd, "--set", "sim.variability.samples=0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "sim.variability.samples" in bad.stderr and "Traceback" not in bad.stderr
