"""The wait for the slowest rank (``simtrain.engine.sync_wait``): the order statistic, the calibrated spread
(``calibration.writer.step_jitter``), the profile field, and what a simulated step does with it."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_calibration_profile import CPU_CONFIG, header, records

from calibration.writer import IQR_PER_SIGMA, build_profile, step_jitter, write_profile
from simtrain import simulate
from simtrain.cli.main import main
from simtrain.engine.sync_wait import expected_max, sync_wait_s
from simtrain.hardware.profile import load_profile
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.studies.simulate import cluster_of


@pytest.mark.parametrize("n,value", [
    (1, 0.0),
    (2, 1.0 / math.sqrt(math.pi)),              # E[max(X1, X2)] = 1/sqrt(pi), exactly
    (3, 3.0 / (2.0 * math.sqrt(math.pi))),      # E[max of 3] = 3 / (2 sqrt(pi)), exactly
    (10, 1.5387527),                             # tabulated expected normal order statistics
    (100, 2.5075936),
    (1000, 3.2414357),
])
def test_expected_maximum_of_normal_draws(n: int, value: float) -> None:
    assert expected_max(n) == pytest.approx(value, abs=1e-6)


def test_expected_maximum_grows_slower_than_its_asymptote() -> None:
    values = [expected_max(n) for n in (2, 8, 64, 512, 4096, 16384, 10**6)]
    assert values == sorted(values)
    assert all(v < math.sqrt(2 * math.log(n)) for v, n in zip(values, (2, 8, 64, 512, 4096, 16384, 10**6), strict=True))
    with pytest.raises(ValueError):
        expected_max(0)


def test_sync_wait_is_the_jitter_times_the_order_statistic() -> None:
    assert sync_wait_s(0.05, 2.0, 2) == pytest.approx(0.05 * 2.0 / math.sqrt(math.pi))
    assert sync_wait_s(0.0, 2.0, 1024) == 0.0 and sync_wait_s(0.05, 2.0, 1) == 0.0
    # a Monte-Carlo check of the statistic itself: the mean of the slower of two normal ranks
    rng = random.Random(7)
    draws = [max(rng.gauss(2.0, 0.1), rng.gauss(2.0, 0.1)) for _ in range(200_000)]
    assert statistics.fmean(draws) - 2.0 == pytest.approx(sync_wait_s(0.05, 2.0, 2), rel=0.02)


def test_work_longer_than_the_measured_step_jitters_by_the_square_root() -> None:
    """sigma = cv x sqrt(ref x W): the measured step's own spread at W = ref, and k steps' worth of work
    (independent increments) sqrt(k) times it, not k times."""
    ref, cv = 0.5, 0.04
    assert sync_wait_s(cv, ref, 2, ref) == pytest.approx(sync_wait_s(cv, ref, 2))  # the measured step itself
    assert sync_wait_s(cv, 4 * ref, 8, ref) == pytest.approx(2.0 * sync_wait_s(cv, ref, 8, ref))
    assert sync_wait_s(cv, ref / 4, 8, ref) == pytest.approx(0.5 * sync_wait_s(cv, ref, 8, ref))
    # Monte-Carlo: a rank's work is k measured steps of independent jitter; the slower of two such ranks
    rng = random.Random(11)
    k = 4
    slower = [max(sum(rng.gauss(ref, cv * ref) for _ in range(k)), sum(rng.gauss(ref, cv * ref) for _ in range(k)))
              for _ in range(100_000)]
    assert statistics.fmean(slower) - k * ref == pytest.approx(sync_wait_s(cv, k * ref, 2, ref), rel=0.03)


def _in_step(i: int, steps: list[float]) -> dict[str, Any]:
    return {"key": f"in_step|{i}", "kind": "in_step", "params": {"round": i}, "status": "ok", "stats": {},
            "result": {"kernels": {}, "step_s": steps}}


def test_step_jitter_pools_the_rounds_over_their_own_medians() -> None:
    """Each round's steps over its median (a slower round is drift, not jitter), pooled, IQR / 1.349."""
    base = [0.90, 0.95, 1.0, 1.0, 1.0, 1.05, 1.10, 1.5]  # one long step: the quartiles ignore it
    recs = [_in_step(0, base), _in_step(1, [2 * x for x in base])]
    got = step_jitter(recs)
    assert got is not None
    pooled = base + base
    q = statistics.quantiles(pooled, n=4, method="inclusive")
    assert got["cv"] == pytest.approx((q[2] - q[0]) / IQR_PER_SIGMA)
    assert got["steps"] == 16 and got["median_s"] == pytest.approx(1.5)  # the rounds' medians 1 and 2
    assert got["sigma_s"] == pytest.approx(got["cv"] * got["median_s"])
    # journals without whole steps, or too few of them: no figure
    assert step_jitter([_in_step(0, base[:5])]) is None
    assert step_jitter([{**_in_step(0, base), "result": {"kernels": {}}}]) is None


def _profile_with_jitter(root: Path, name: str, steps: list[float]) -> Path:
    pytest.importorskip("scipy")
    folder = root / "calibrated" / name
    return write_profile(folder, build_profile(name, header(), records() + [_in_step(0, steps)]))


def test_profile_step_jitter_reaches_the_gpu_spec_and_the_two_process_step(profiles_dir: Path) -> None:
    steps = [1.0 + 0.01 * k for k in range(-10, 11)]  # uniform-ish, cv of the quartiles ~ 0.074
    _profile_with_jitter(profiles_dir, "jit", steps)
    _profile_with_jitter(profiles_dir, "still", [1.0] * 21)  # no spread
    cv = load_profile("jit").summary["step_jitter"]["cv"]
    assert cv > 0.05
    assert cluster_of(load_config(CPU_CONFIG, ["hardware.profile=jit"])).gpu.step_time_cv == pytest.approx(cv)
    one, two = (simulate(CPU_CONFIG, ["hardware.profile=jit", *extra])
                for extra in ([], ["layout.dp=2", "train.global_batch_seqs=4"]))
    quiet = simulate(CPU_CONFIG, ["hardware.profile=still", "layout.dp=2", "train.global_batch_seqs=4"])
    assert one.breakdown_s["sync_wait"] == 0.0  # one process waits for no one
    assert quiet.breakdown_s["sync_wait"] == 0.0
    gpu = cluster_of(load_config(CPU_CONFIG, ["hardware.profile=jit"])).gpu
    assert gpu.step_time_ref_s > 0
    assert gpu.step_time_ref_s == pytest.approx(load_profile("jit").summary["step_jitter"]["median_s"])
    bd = two.breakdown_s
    work = bd["compute"] + bd["optimizer"]
    assert bd["sync_wait"] == pytest.approx(cv * math.sqrt(gpu.step_time_ref_s * work) / math.sqrt(math.pi))
    # everything but the wait is the engine's step of identical ranks (the zero-spread profile's)
    assert two.step_time_s == pytest.approx(quiet.step_time_s + bd["sync_wait"])
    assert two.tokens_per_s == pytest.approx(quiet.tokens_per_s * quiet.step_time_s / two.step_time_s)


def test_the_search_estimate_waits_as_the_simulation_does(profiles_dir: Path) -> None:
    """The layout search's estimate adds the same wait (critical stage's compute and optimizer, the world's
    ranks), so a jittering CPU profile ranks layouts on the step simulate reports; none on a GPU profile."""
    from simtrain.studies.estimate import Estimator

    _profile_with_jitter(profiles_dir, "jit-est", [1.0 + 0.01 * k for k in range(-10, 11)])
    run = load_config(CPU_CONFIG, ["hardware.profile=jit-est", "layout.dp=2", "train.global_batch_seqs=4"])
    gpu = cluster_of(run).gpu
    est = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio).estimate(run.layout, run.train)
    assert est.sync_wait_s > 0
    assert est.sync_wait_s == pytest.approx(sync_wait_s(gpu.step_time_cv, est.compute_s + est.optimizer_s, 2,
                                                       gpu.step_time_ref_s))
    assert est.components()["wait for the slowest rank"] == est.sync_wait_s
    big = load_config(str(Path(__file__).resolve().parents[2] / "examples" / "llama3_70b_h100.yaml"))
    assert Estimator(big.model, cluster_of(big)).estimate(big.layout, big.train).sync_wait_s == 0.0


def test_bad_step_jitter_is_a_clear_error(profiles_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _profile_with_jitter(profiles_dir, "bad", [1.0 + 0.01 * k for k in range(10)])
    data = yaml.safe_load(path.read_text())
    data["summary"]["step_jitter"]["cv"] = -0.2
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"summary\.step_jitter\.cv"):
        load_profile("bad")
    data["summary"]["step_jitter"].update(cv=0.02, median_s=0.0)  # the measured step's length must be > 0
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"summary\.step_jitter\.median_s"):
        load_profile("bad")
    assert main(["simulate", CPU_CONFIG, "--set", "hardware.profile=bad"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_builtin_gpus_have_no_jitter() -> None:
    """No public per-step jitter figure for a GPU rank: the built-in profiles wait for no one."""
    from simtrain.hardware.load import list_gpus, load_gpu

    assert all(load_gpu(name).step_time_cv == 0.0 for name in list_gpus())


def test_cli_prints_the_wait_for_the_slowest_rank(profiles_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _profile_with_jitter(profiles_dir, "jit-cli", [1.0 + 0.01 * k for k in range(-10, 11)])
    two = ["--set", "hardware.profile=jit-cli", "--set", "layout.dp=2", "--set", "train.global_batch_seqs=4"]
    assert main(["simulate", CPU_CONFIG, *two]) == 0
    assert "wait for the slowest rank" in capsys.readouterr().out
    assert main(["simulate", CPU_CONFIG, "--set", "hardware.profile=jit-cli"]) == 0  # one process: no wait
    assert "wait for the slowest rank" not in capsys.readouterr().out
