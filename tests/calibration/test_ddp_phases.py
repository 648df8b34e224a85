"""benchmarks/ddp_phases.py reads simtrain's forward / backward / optimizer phases from the trace; they must
agree with the engine's own step breakdown, or the benchmark's side-by-side table compares the wrong parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from simtrain.studies.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "tests" / "calibration" / "data" / "grid" / "l2-s1024-v8k.yaml"


def _phases() -> ModuleType:
    """The benchmark script as a module (it imports torch: skipped without the calibration extra)."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("ddp_phases", ROOT / "benchmarks" / "ddp_phases.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ddp_phases", mod)
    spec.loader.exec_module(mod)
    return mod


def _overrides(processes: int) -> list[str]:
    compare = pytest.importorskip("calibration.compare")
    return [*compare.run_overrides(processes, 1), "hardware.profile=example-cpu"]


def test_one_process_phases_are_the_breakdowns_compute_and_optimizer() -> None:
    phases = _phases().predicted(str(GRID), "example-cpu", 1)
    res = simulate(str(GRID), _overrides(1))
    assert phases["step"] == pytest.approx(res.step_time_s, rel=1e-12)
    assert phases["optimizer"] == pytest.approx(res.breakdown_s["optimizer"], rel=1e-9)
    # one process: no communication, so forward and backward are the breakdown's compute
    assert phases["forward"] + phases["backward"] == pytest.approx(res.breakdown_s["compute"], rel=1e-9)
    assert 0 < phases["forward"] < phases["backward"]  # a backward does about twice the forward's GEMM work


def test_ddp_adds_its_buckets_and_all_reduce_to_the_backward_only() -> None:
    mod = _phases()
    one, two = mod.predicted(str(GRID), "example-cpu", 1), mod.predicted(str(GRID), "example-cpu", 2)
    res = simulate(str(GRID), _overrides(2))
    assert two["step"] == pytest.approx(res.step_time_s - res.breakdown_s["sync_wait"], rel=1e-12)
    assert two["step, max of ranks"] == pytest.approx(res.step_time_s, rel=1e-12)
    assert two["backward"] - one["backward"] >= res.breakdown_s["exposed_comm"]["dp"] > 0
