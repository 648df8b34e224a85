"""The CPU loop: measure a real training step, predict it with simtrain from a calibrated profile, compare.

    python -m calibration.compare --config tests/calibration/data/cpu_llama.yaml --profile this-cpu \\
        --processes 1 2

For each process count N the real step (``calibration.realstep``: transformers' Llama, DDP over gloo
when N > 1, ``--threads`` threads per process) is timed in its own processes, and simtrain simulates
the same run with ``layout.dp=N`` on the profile (a CPU profile's node holds N processes). Printed:
measured median, predicted, and the error (predicted / measured - 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from calibration.launch import RankFailed, launch_local
from calibration.shapes import read_run
from calibration.steal import MAX_STEAL_FRACTION, cpu_ticks, steal_fraction
from calibration.timing import Clock
from simtrain import simulate
from simtrain.engine.results import StepResult


@dataclass(frozen=True)
class Comparison:
    """One process count: measured step times (seconds), the prediction, and the relative error."""

    processes: int
    measured_s: tuple[float, ...]
    predicted_s: float
    implementation: str
    sync_wait_s: float = 0.0
    """Of ``predicted_s``, the wait for the slower rank (``simtrain.engine.sync_wait``; 0 for one process)."""

    @property
    def measured_median_s(self) -> float:
        return statistics.median(self.measured_s)

    @property
    def error(self) -> float:
        """predicted / measured median - 1."""
        return self.predicted_s / self.measured_median_s - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "measured_median_s": self.measured_median_s, "error": self.error}


def run_overrides(processes: int, micro_batch_size: int) -> list[str]:
    """simtrain overrides of the loop's config for ``processes`` DDP ranks, one micro-batch each."""
    return [f"layout.dp={processes}", f"train.global_batch_seqs={processes * micro_batch_size}"]


STEADY_TRIES = 3


def measure_steady(config: str, processes: int, steps: int, warmup: int, threads: int, workdir: Path,
                   tries: int = STEADY_TRIES, max_steal: float = MAX_STEAL_FRACTION) -> dict[str, Any]:
    """``measure``, repeated (at most ``tries`` times) while the hypervisor stole more than
    ``max_steal`` of the CPU time during it; the least disturbed batch is returned (``least_stolen``)."""
    return least_stolen(lambda: measure(config, processes, steps, warmup, threads, workdir), tries, max_steal)


def least_stolen(batch: Callable[[], dict[str, Any]], tries: int = STEADY_TRIES,
                 max_steal: float = MAX_STEAL_FRACTION) -> dict[str, Any]:
    """``batch()`` (a measurement with a ``steal_fraction``), repeated (at most ``tries`` times) while the
    hypervisor stole more than ``max_steal`` of the CPU time during it; the least disturbed one.

    On a shared virtual machine a batch can run while the host gives "our" cores to another guest
    (``calibration.steal``): its step times then say nothing about the workload.
    """
    batches = []
    for _ in range(tries):
        batches.append(batch())
        if batches[-1]["steal_fraction"] <= max_steal:
            break
    return min(batches, key=lambda b: b["steal_fraction"])


def measure(config: str, processes: int, steps: int, warmup: int, threads: int, workdir: Path,
            timeout_s: float = 600.0) -> dict[str, Any]:
    """Time the real step of ``config`` with ``processes`` ranks; returns realstep's result dict plus
    ``steal_fraction``, the share of CPU time the hypervisor stole while it ran (``calibration.steal``)."""
    ticks = cpu_ticks()
    run = read_run(config)
    spec = workdir / "model.json"
    spec.write_text(run.model.model_dump_json())
    out = workdir / f"real-{processes}.json"
    args = ["--model-json", str(spec), "--seq-len", str(run.train.seq_len), "--micro-batch-size",
            str(run.train.micro_batch_size), "--steps", str(steps), "--warmup", str(warmup), "--threads",
            str(threads), "--out", str(out)]
    if processes == 1:
        proc = subprocess.run([sys.executable, "-m", "calibration.realstep", *args], capture_output=True, text=True,
                              timeout=timeout_s, env=_env(threads))
        if proc.returncode != 0:
            raise RankFailed(f"the real step failed: {proc.stderr.strip()[-2000:]}")
    else:
        out.unlink(missing_ok=True)
        try:
            launch_local([*args, "--ddp"], processes, threads, timeout_s, log_dir=workdir / f"logs-{processes}",
                         module="calibration.realstep")
        except RankFailed as exc:
            # rank 0 writes the result atomically after the timed steps: a rank that dies later, while
            # the process group is torn down, does not invalidate it
            if not out.is_file():
                raise
            print(f"calibration.compare: a rank failed after the result was written; kept it ({exc})",
                  file=sys.stderr)
    result: dict[str, Any] = json.loads(out.read_text())
    result["steal_fraction"] = steal_fraction(ticks, cpu_ticks())
    return result


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def predict(config: str, profile: str, processes: int) -> StepResult:
    """simtrain's predicted step of ``config`` with ``processes`` ranks on ``profile``."""
    run = read_run(config)
    return simulate(config, [*run_overrides(processes, run.train.micro_batch_size), f"hardware.profile={profile}"])


def step_times_field(clock: Clock, processes: int) -> str:
    """The field of a measurement batch (``measure``) whose step times ``compare`` reads: the main thread's CPU
    time for one process under ``Clock.THREAD_CPU``, else the wall time (``compare``'s docstring)."""
    return "cpu_step_times_s" if clock is Clock.THREAD_CPU and processes == 1 else "step_times_s"


def compare(config: str, profile: str, processes: int, measured: list[dict[str, Any]],
            clock: Clock = Clock.WALL) -> Comparison:
    """A Comparison from one or more measurement batches (their step times pooled).

    ``clock``: the profile's (``calibration.timing.Clock``); with ``THREAD_CPU`` a one-process step is
    compared by its main thread's CPU time, the clock its kernels were measured with. Several processes
    are compared by wall time (a DDP step waits on its peer and on gloo's threads, which no one
    thread's CPU time holds).
    """
    field = step_times_field(clock, processes)
    times = tuple(t for m in measured for t in m[field])
    res = predict(config, profile, processes)
    return Comparison(processes, times, res.step_time_s, measured[0]["implementation"],
                      res.breakdown_s.get("sync_wait", 0.0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="simtrain run config of the model and batch")
    p.add_argument("--profile", required=True, help="calibrated profile name or path")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.WALL.value,
                   help="the profile's calibrate --clock: thread_cpu compares one process by its CPU time")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="simtrain-compare-") as tmp:
        for n in args.processes:
            c = compare(args.config, args.profile, n, [measure_steady(args.config, n, args.steps, args.warmup,
                                                                      args.threads, Path(tmp))],
                        Clock(args.clock))
            print(f"{n} process(es): measured {c.measured_median_s:.3f} s (median of {len(c.measured_s)}), "
                  f"predicted {c.predicted_s:.3f} s, error {100 * c.error:+.1f} % [{c.implementation}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
