"""The CPU loop for pipeline parallelism: a real pipelined step against simtrain's pipeline engine.

    python -m calibration.compare_pp --config tests/calibration/data/cpu_llama.yaml --profile this-cpu \\
        --microbatches 2 4 8 --schedules 1f1b gpipe interleaved_1f1b

For each case (stages, micro-batches, schedule) the real step (``calibration.realstep_pp``: transformers'
Llama split into stages, run by ``torch.distributed.pipelining`` over gloo, one process per stage and one
thread each) is timed, and simtrain simulates the same run with ``layout.pp``, ``layout.schedule`` (and
``layout.vpp``, the chunks per rank of an interleaved schedule) and a global batch of that many
micro-batches on the profile (a CPU profile's node holds the stages' processes). Printed: measured median,
predicted, the error (predicted / measured - 1) and each rank's busy time, measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.compare import Comparison, least_stolen
from calibration.launch import RankFailed, launch_local
from calibration.realstep_pp import CHUNKED, SCHEDULES, chunks_of
from calibration.shapes import read_run
from calibration.steal import cpu_ticks, steal_fraction
from simtrain import simulate


@dataclass(frozen=True, slots=True)
class PipelineCase:
    """One pipelined run of a config: ``stages`` processes, ``microbatches`` per step, a schedule of
    ``calibration.realstep_pp.SCHEDULES`` (simtrain's ``layout.schedule`` of the same name) and its
    ``chunks`` model chunks per rank: ``layout.vpp`` of an interleaved one, 2 for DualPipeV (whose V
    simtrain places itself, ``layout.vpp`` 1), 1 for the others."""

    stages: int
    microbatches: int
    schedule: str
    chunks: int = 1

    def __post_init__(self) -> None:
        if self.chunks != chunks_of(self.schedule, self.chunks):
            raise ValueError(f"chunks={self.chunks}: {self.schedule} runs {chunks_of(self.schedule, self.chunks)} "
                             f"per rank (several only under {', '.join(CHUNKED)})")

    @property
    def vpp(self) -> int:
        """simtrain's ``layout.vpp`` for this case: the chunks of interleaved 1F1B, 1 for the others (DualPipeV
        places its two chunks itself)."""
        return self.chunks if self.schedule == "interleaved_1f1b" else 1

    def overrides(self, micro_batch_size: int) -> list[str]:
        """simtrain overrides of the config for this case (no data parallelism)."""
        return ["layout.dp=1", f"layout.pp={self.stages}", f"layout.vpp={self.vpp}",
                f"layout.schedule={self.schedule}", f"train.global_batch_seqs={self.microbatches * micro_batch_size}"]

    @property
    def label(self) -> str:
        chunks = f" v{self.chunks}" if self.chunks > 1 else ""
        return f"pp{self.stages}{chunks} {self.schedule} x{self.microbatches}"


@dataclass(frozen=True)
class PipelineComparison(Comparison):
    """A ``Comparison`` of a pipelined step (``processes``: its stages), with the case it ran and each rank's
    busy time, measured (median over the batches; empty where torch's waits could not be timed) and
    simulated (the rank's compute stream in simtrain's trace), seconds."""

    case: PipelineCase | None = None
    busy_measured_s: tuple[float, ...] = ()
    busy_predicted_s: tuple[float, ...] = ()


def measure_pp(config: str, case: PipelineCase, steps: int, warmup: int, threads: int, workdir: Path,
               timeout_s: float = 600.0) -> dict[str, Any]:
    """Time the real pipelined step of ``config`` for ``case``; realstep_pp's result dict plus
    ``steal_fraction``, the share of CPU time the hypervisor stole while it ran (``calibration.steal``)."""
    if case.schedule not in SCHEDULES:
        raise ValueError(f"schedule {case.schedule!r}: the real step runs {', '.join(SCHEDULES)}")
    ticks = cpu_ticks()
    run = read_run(config)
    spec = workdir / "model.json"
    spec.write_text(run.model.model_dump_json())
    out = workdir / f"real-pp{case.stages}.json"
    out.unlink(missing_ok=True)
    args = ["--model-json", str(spec), "--seq-len", str(run.train.seq_len), "--micro-batch-size",
            str(run.train.micro_batch_size), "--microbatches", str(case.microbatches), "--schedule", case.schedule,
            "--chunks", str(case.chunks),
            "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads), "--out", str(out)]
    try:
        launch_local(args, case.stages, threads, timeout_s, log_dir=workdir / f"logs-pp{case.stages}",
                     module="calibration.realstep_pp")
    except RankFailed:
        if not out.is_file():  # rank 0 writes the result after the timed steps; a later teardown error keeps it
            raise
    result: dict[str, Any] = json.loads(out.read_text())
    result["steal_fraction"] = steal_fraction(ticks, cpu_ticks())
    return result


def measure_pp_steady(config: str, case: PipelineCase, steps: int, warmup: int, threads: int,
                      workdir: Path) -> dict[str, Any]:
    """``measure_pp``, measured again while the hypervisor stole too much of the CPU (``least_stolen``)."""
    return least_stolen(lambda: measure_pp(config, case, steps, warmup, threads, workdir))


def predict_pp(config: str, profile: str, case: PipelineCase) -> tuple[float, tuple[float, ...]]:
    """simtrain's predicted step time of ``config`` pipelined as ``case`` on ``profile`` and each rank's busy
    time (the compute stream of its trace), seconds."""
    run = read_run(config)
    res = simulate(config, [*case.overrides(run.train.micro_batch_size), f"hardware.profile={profile}"], trace=True)
    busy = [0.0] * case.stages
    for e in res.trace:
        if e.stream == "compute":
            busy[e.rank] += e.end_s - e.start_s
    return res.step_time_s, tuple(busy)


def compare_pp(config: str, profile: str, case: PipelineCase, measured: list[dict[str, Any]]) -> PipelineComparison:
    """A PipelineComparison from one or more measurement batches (their wall-clock step times pooled, their
    ranks' busy times the median over the batches)."""
    times = tuple(t for m in measured for t in m["step_times_s"])
    predicted, busy = predict_pp(config, profile, case)
    per_batch = [m["busy_s_per_rank"] for m in measured if m.get("busy_s_per_rank")]
    measured_busy = tuple(statistics.median(b[r] for b in per_batch) for r in range(case.stages)) if per_batch else ()
    return PipelineComparison(case.stages, times, predicted, measured[0]["implementation"], case=case,
                              busy_measured_s=measured_busy, busy_predicted_s=busy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.compare_pp", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="simtrain run config of the model and micro-batch")
    p.add_argument("--profile", required=True, help="calibrated profile name or path")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, nargs="+", default=[4])
    p.add_argument("--schedules", nargs="+", choices=tuple(SCHEDULES), default=["1f1b"])
    p.add_argument("--chunks", type=int, default=2, help="model chunks per rank under interleaved_1f1b")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="simtrain-compare-pp-") as tmp:
        for schedule in args.schedules:
            for m in args.microbatches:
                case = PipelineCase(args.stages, m, schedule, chunks_of(schedule, args.chunks))
                c = compare_pp(args.config, args.profile, case,
                               [measure_pp_steady(args.config, case, args.steps, args.warmup, args.threads, Path(tmp))])
                busy = ", ".join(f"rank {r} {m:.3f}/{p:.3f} s" for r, (m, p) in
                                 enumerate(zip(c.busy_measured_s, c.busy_predicted_s, strict=False)))
                print(f"{case.label}: measured {c.measured_median_s:.3f} s (median of {len(c.measured_s)}), "
                      f"predicted {c.predicted_s:.3f} s, error {100 * c.error:+.1f} %; busy measured/predicted: "
                      f"{busy or '-'} [{c.implementation}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
