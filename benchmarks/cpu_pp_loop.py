"""The CPU loop for pipeline parallelism: calibrate this CPU for a config, time real pipelined steps of
transformers' Llama under torch's own schedules, compare with simtrain's pipeline engine, write the table.

    python benchmarks/cpu_pp_loop.py   # cpu_llama.yaml, pp2: 1F1B x2/4/8, GPipe x4, interleaved 1F1B (v2) x4/8, DualPipeV x4/8
    python benchmarks/cpu_pp_loop.py --configs tests/calibration/data/grid/l8-s128-v4k.yaml --microbatches 4

For each config the real step of every case (``calibration.compare_pp``: ``--stages`` processes over gloo,
one thread each, ``torch.distributed.pipelining``'s ``Schedule1F1B`` / ``ScheduleGPipe`` /
``ScheduleInterleaved1F1B`` / ``ScheduleDualPipeV``) is measured, then
``simtrain calibrate --device cpu --config CONFIG`` makes a fresh profile (wall clock, with the gloo
collectives: its point-to-point curve prices the activations' sends), then every case is measured again;
the two batches bracket the calibration in time and are pooled, and the prediction of ``simulate`` with
``layout.pp``, ``layout.schedule`` and that many micro-batches is compared with their median. The
prediction's distance outside the range of the two batches' medians is reported too (``outside``: 0 when
it lies between them), as ``tests/calibration/test_calibration_cpu_grid.py`` judges a noisy machine.

Output: ``OUT.json`` (every measurement) and ``OUT.md`` (the table), written atomically after each config.
Nothing fails: the script prints the table and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from benchmarks.cpu_loop_grid import calibrate, describe  # noqa: E402
from calibration.compare import Comparison, compare, measure_steady  # noqa: E402
from calibration.compare_pp import PipelineCase, compare_pp, measure_pp_steady  # noqa: E402
from calibration.timing import Clock  # noqa: E402
from simtrain.engine.trace import write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "tests" / "calibration" / "data" / "cpu_llama.yaml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cpu_pp_loop"


def outside(predicted: float, halves: list[float]) -> float:
    """How far ``predicted`` lies outside [min, max] of ``halves``, relative to the nearer end (signed; 0 inside)."""
    lo, hi = min(halves), max(halves)
    if predicted > hi:
        return predicted / hi - 1.0
    if predicted < lo:
        return predicted / lo - 1.0
    return 0.0


def one_config(config: str, cases: list[PipelineCase], steps: int, warmup: int, work: Path,
               env: dict[str, str]) -> list[dict[str, Any]]:
    """Measure every case and the unpipelined step, calibrate, measure again, compare: one row per case, the
    first the one-process step (stages 1: the calibration's own error here, which the pipelined rows share)."""
    name = f"pp-{Path(config).stem}"
    solo_before = measure_steady(config, 1, steps, warmup, 1, work)
    before = [measure_pp_steady(config, c, steps, warmup, 1, work) for c in cases]
    calibrate_s = calibrate(config, name, Clock.WALL, True, env)
    after = [measure_pp_steady(config, c, steps, warmup, 1, work) for c in cases]
    solo_after = measure_steady(config, 1, steps, warmup, 1, work)
    os.environ["SIMTRAIN_PROFILES_DIR"] = env["SIMTRAIN_PROFILES_DIR"]
    rows = []
    try:
        rows.append(row(config, 1, "-", 1, compare(config, name, 1, [solo_before, solo_after]), solo_before,
                        solo_after, calibrate_s))
        for case, b, a in zip(cases, before, after, strict=True):
            schedule = case.schedule + (f" v{case.vpp}" if case.vpp > 1 else "")
            rows.append(row(config, case.stages, schedule, case.microbatches, compare_pp(config, name, case, [b, a]),
                            b, a, calibrate_s))
    finally:
        del os.environ["SIMTRAIN_PROFILES_DIR"]
    return rows


def row(config: str, stages: int, schedule: str, microbatches: int, c: Comparison, before: dict[str, Any],
        after: dict[str, Any], calibrate_s: float) -> dict[str, Any]:
    """One table row: the case, the comparison, and the two batches' medians and steal."""
    halves = [statistics.median(before["step_times_s"]), statistics.median(after["step_times_s"])]
    return {**describe(config), "stages": stages, "schedule": schedule, "microbatches": microbatches,
            "measured_s": c.measured_median_s, "predicted_s": c.predicted_s, "error": c.error,
            "outside": outside(c.predicted_s, halves), "before_after_s": halves,
            "repeatability": max(halves) / min(halves) - 1.0, "steal": [before["steal_fraction"], after["steal_fraction"]],
            "calibrate_s": calibrate_s, "implementation": c.implementation,
            "busy_measured_s": list(getattr(c, "busy_measured_s", ())),
            "busy_predicted_s": list(getattr(c, "busy_predicted_s", ()))}


def busiest(r: dict[str, Any]) -> str:
    """The busiest rank's own work in a row (its step less its waits for transfers), measured / predicted."""
    if not r["busy_measured_s"]:
        return "-"
    k = max(range(len(r["busy_measured_s"])), key=lambda i: r["busy_measured_s"][i])
    return f"{k}: {r['busy_measured_s'][k]:.3f} / {r['busy_predicted_s'][k]:.3f}"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The table of one run, with the median |error| and median signed error over its rows."""
    lines = [f"# CPU pipeline loop ({meta['date']}, wall clock, one thread per stage)", "",
             "| config | layers | seq | vocab | b | stages | schedule | micro-batches | measured s | predicted s | "
             "error | outside before/after | before/after | steal | busiest rank: busy s measured / predicted |",
             "|" + "---|" * 15]
    for r in rows:
        lines.append(f"| {r['config']} | {r['layers']} | {r['seq_len']} | {r['vocab']} | {r['micro_batch_size']} | "
                     f"{r['stages']} | {r['schedule']} | {r['microbatches']} | {r['measured_s']:.3f} | "
                     f"{r['predicted_s']:.3f} | {100 * r['error']:+.1f} % | {100 * r['outside']:+.1f} % | "
                     f"{100 * r['repeatability']:.1f} % | {100 * max(r['steal']):.1f} % | {busiest(r)} |")
    piped = [r for r in rows if r["stages"] > 1]
    if piped:
        errs = [r["error"] for r in piped]
        lines += ["", f"{len(piped)} pipelined cases: median |error| {100 * statistics.median(abs(e) for e in errs):.1f} %, "
                  f"median signed {100 * statistics.median(errs):+.1f} %, worst {100 * max(errs, key=abs):+.1f} %."]
    lines += ["", "stages 1: the same step on one process (no pipeline), measured and calibrated in the same round: the "
              "calibration's own error at that time, which the pipelined cases share.",
              "error: the prediction against the pooled median of the real step measured before and after the "
              "calibration; outside: how far the prediction lies outside the range of those two batches' medians "
              "(0: inside); before/after: how far apart those medians are (the real step's own repeatability); "
              "busiest rank: the rank with the most work of its own (its step less its waits for transfers, median "
              "of the batches) against its compute stream in simtrain's trace."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/cpu_pp_loop.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=[str(DEFAULT_CONFIG)])
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8], help="1F1B's micro-batch counts")
    p.add_argument("--gpipe", type=int, nargs="*", default=[4], help="GPipe's micro-batch counts (none: skip it)")
    p.add_argument("--interleaved", type=int, nargs="*", default=[4, 8],
                   help="interleaved 1F1B's micro-batch counts, multiples of --stages (none: skip it)")
    p.add_argument("--chunks", type=int, default=2, help="model chunks per rank under interleaved 1F1B (layout.vpp)")
    p.add_argument("--dualpipev", type=int, nargs="*", default=[4, 8],
                   help="DualPipeV's micro-batch counts, at least 2 x --stages (none: skip it)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output path without suffix (.json and .md are written)")
    p.add_argument("--work", help="keep the profiles and real-step results in this folder (default: a temporary one)")
    args = p.parse_args(argv)
    cases = ([PipelineCase(args.stages, m, "1f1b") for m in args.microbatches]
             + [PipelineCase(args.stages, m, "gpipe") for m in args.gpipe]
             + [PipelineCase(args.stages, m, "interleaved_1f1b", args.chunks) for m in args.interleaved]
             + [PipelineCase(args.stages, m, "dualpipev", 2) for m in args.dualpipev])
    rows: list[dict[str, Any]] = []
    text = ""
    with tempfile.TemporaryDirectory(prefix="simtrain-pp-loop-") as tmp:
        work = Path(args.work or tmp)
        (work / "profiles" / "calibrated").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SIMTRAIN_PROFILES_DIR": str(work / "profiles")}
        for config in args.configs:
            for r in one_config(config, cases, args.steps, args.warmup, work, env):
                rows.append(r)
                print(f"{r['config']}: pp{r['stages']} {r['schedule']} x{r['microbatches']} measured "
                      f"{r['measured_s']:.3f} s, predicted {r['predicted_s']:.3f} s, error {100 * r['error']:+.1f} %",
                      flush=True)
            meta = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "warmup": args.warmup}
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(out.with_suffix(".json"), json.dumps({**meta, "rows": rows}, indent=2))
            text = markdown(rows, meta)
            write_atomic(out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
