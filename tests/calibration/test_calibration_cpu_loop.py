"""The CPU loop: calibrate this CPU, run a real Llama training step (transformers), compare with simtrain.

``simtrain calibrate --device cpu --config cpu_llama.yaml --out this-cpu`` (compute, and gloo
collectives with 2 processes) must finish in under 3 minutes; then transformers' LlamaForCausalLM
(randomly initialised from the config's dims; not simtrain's code) is trained for a few steps on
one process and with DDP over gloo on two, one thread each, and simtrain's predicted step time
from that calibration must be within 20 % of the measured median.

The machine is shared and noisy: its speed changes while tests run. The real steps are measured in
two batches, one before and one after the calibration, so the measurement brackets the calibration
in time, and their pooled median is compared. The numbers land in ``cpu_loop.json`` in the test's
temporary folder and are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibration.compare import compare, measure  # noqa: E402
from simtrain.profile import load_profile  # noqa: E402

pytestmark = pytest.mark.timing

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(Path(__file__).parent / "data" / "cpu_llama.yaml")
TOLERANCE = 0.20  # the bound on |predicted / measured - 1|
CALIBRATE_LIMIT_S = 180.0
STEPS, WARMUP = 6, 2


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("cpu-loop")
    root = work / "profiles"
    (root / "calibrated").mkdir(parents=True)
    for kind in ("gpus", "nodes"):
        (root / kind).symlink_to(REPO / "hardware_profiles" / kind)
    env = {**os.environ, "SIMTRAIN_PROFILES_DIR": str(root)}
    before = {n: measure(CONFIG, n, STEPS, WARMUP, 1, work) for n in (1, 2)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "simtrain.cli", "calibrate", "--device", "cpu", "--config", CONFIG,
                           "--out", "this-cpu"], env=env, capture_output=True, text=True, timeout=600)
    calibrate_s = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = {n: measure(CONFIG, n, STEPS, WARMUP, 1, work) for n in (1, 2)}
    os.environ["SIMTRAIN_PROFILES_DIR"] = str(root)
    try:
        comps = {n: compare(CONFIG, "this-cpu", n, [before[n], after[n]]) for n in (1, 2)}
        profile = load_profile("this-cpu")
    finally:
        del os.environ["SIMTRAIN_PROFILES_DIR"]
    report = {"calibrate_s": calibrate_s, "comparisons": {n: c.to_dict() for n, c in comps.items()},
              "calibrate_stdout": proc.stdout}
    (work / "cpu_loop.json").write_text(json.dumps(report, indent=2))
    print(f"\nCPU loop: calibration {calibrate_s:.0f} s")
    for n, c in comps.items():
        print(f"  {n} process(es): measured {c.measured_median_s:.3f} s, predicted {c.predicted_s:.3f} s, "
              f"error {100 * c.error:+.1f} % ({c.implementation})")
    return {"calibrate_s": calibrate_s, "comparisons": comps, "profile": profile, "work": work}


def test_calibration_finishes_in_time(loop: dict[str, Any]) -> None:
    assert loop["calibrate_s"] < CALIBRATE_LIMIT_S


def test_profile_has_compute_and_gloo_curves(loop: dict[str, Any]) -> None:
    prof = loop["profile"]
    assert prof.kind == "cpu" and prof.max_processes == 2
    assert prof.compute.gemm is not None and prof.compute.attention is not None
    assert {"norm", "act", "rope", "cross_entropy", "optimizer.step", "copy"} <= set(prof.compute.memory_ops)
    assert {k[0] for k in prof.collectives.curves} >= {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                       "broadcast", "send"}
    assert 2 in prof.contention


def test_real_step_is_transformers_llama(loop: dict[str, Any]) -> None:
    assert all(c.implementation == "transformers.LlamaForCausalLM" for c in loop["comparisons"].values())


@pytest.mark.parametrize("processes", [1, 2])
def test_predicted_step_time_within_20_percent(loop: dict[str, Any], processes: int) -> None:
    c = loop["comparisons"][processes]
    assert abs(c.error) < TOLERANCE, (f"{processes} process(es): predicted {c.predicted_s:.3f} s vs measured "
                                      f"median {c.measured_median_s:.3f} s of {c.measured_s}; the profile's contention "
                                      f"factors {loop['profile'].contention}")
