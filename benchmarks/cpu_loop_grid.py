"""The CPU loop on a grid of configurations: calibrate this CPU for each, time real transformers Llama
steps, compare with simtrain's prediction, and write the table (issue 29 part 5).

    python benchmarks/cpu_loop_grid.py                                  # every grid config, 1 and 2 processes
    python benchmarks/cpu_loop_grid.py --processes 1 --configs tests/calibration/data/grid/l2-s512-v16k.yaml
    python benchmarks/cpu_loop_grid.py --clock wall                     # elapsed time (a quiet machine)
    python benchmarks/cpu_loop_grid.py --processes 1 --ddp-configs l8-s128-v4k   # DDP on some configs only
    python benchmarks/cpu_loop_grid.py --processes 2 --out benchmarks/results/cpu_loop_grid_ddp   # DDP only

For each config (``tests/calibration/data/grid/*.yaml``: sequence lengths 128-1,024, vocabularies
4K-32K, 2-8 layers, 1-8 query heads per KV head) the real step is measured (``calibration.compare.
measure_steady``: one process, and DDP over gloo on two; one thread each; batches of ``--steps`` and
``--ddp-steps`` timed steps), then ``simtrain calibrate
--device cpu --config CONFIG`` makes a fresh profile, then the real step is measured again; the two
batches are pooled (they bracket the calibration in time) and compared with ``simulate`` on that
profile. ``--clock thread_cpu`` (the default) times the calibration's kernels and the one-process
step by the CPU time of the measuring thread (``calibration.timing.Clock``), which leaves out the
time other processes on a shared machine held the core; DDP steps are always wall time.

Output: ``OUT.json`` (every measurement) and ``OUT.md`` (the table with median |error|, median signed
error and the worst case), written atomically. Nothing fails: the script prints the table and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from calibration.compare import compare, measure_steady, step_times_field  # noqa: E402
from calibration.shapes import read_run  # noqa: E402
from calibration.timing import Clock  # noqa: E402
from simtrain.engine.trace import write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "tests" / "calibration" / "data" / "grid"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cpu_loop_grid"


def describe(config: str) -> dict[str, Any]:
    """The grid axes of one config: layers, sequence length, vocabulary, query heads per KV head, ..."""
    run = read_run(config)
    m, t = run.model, run.train
    return {"config": Path(config).stem, "layers": m.n_layers, "hidden": m.hidden, "seq_len": t.seq_len,
            "vocab": m.vocab, "gqa": m.n_heads // m.kv_heads, "micro_batch_size": t.micro_batch_size}


def calibrate(config: str, name: str, clock: Clock, collectives: bool, env: dict[str, str]) -> float:
    """``simtrain calibrate --device cpu --config config --out name``; returns its wall time, seconds."""
    cmd = [sys.executable, "-m", "simtrain.cli.main", "calibrate", "--device", "cpu", "--config", config, "--out", name,
           "--clock", clock.value, "--fresh"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd + ([] if collectives else ["--no-collectives"]), env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"calibrate {config} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def one_config(config: str, processes: list[int], clock: Clock, steps: dict[int, int], warmup: int, work: Path,
               env: dict[str, str]) -> dict[str, Any]:
    """Measure, calibrate, measure, compare: one row per process count (``steps``: timed steps per batch, per
    process count)."""
    name = f"grid-{Path(config).stem}"
    before = {n: measure_steady(config, n, steps[n], warmup, 1, work) for n in processes}
    calibrate_s = calibrate(config, name, clock, max(processes) > 1, env)
    after = {n: measure_steady(config, n, steps[n], warmup, 1, work) for n in processes}
    os.environ["SIMTRAIN_PROFILES_DIR"] = env["SIMTRAIN_PROFILES_DIR"]
    rows = []
    try:
        for n in processes:
            c = compare(config, name, n, [before[n], after[n]], clock)
            field = step_times_field(clock, n)
            halves = [statistics.median(before[n][field]), statistics.median(after[n][field])]
            rows.append({**describe(config), "processes": n, "clock": clock.value if n == 1 else "wall",
                         "measured_s": c.measured_median_s, "predicted_s": c.predicted_s, "error": c.error,
                         "sync_wait_s": c.sync_wait_s,
                         "before_after_s": halves, "repeatability": max(halves) / min(halves) - 1.0,
                         "cpu_share": [statistics.median(before[n]["cpu_share"]),
                                       statistics.median(after[n]["cpu_share"])],
                         "steal": [before[n]["steal_fraction"], after[n]["steal_fraction"]],
                         "calibrate_s": calibrate_s, "implementation": c.implementation})
    finally:
        del os.environ["SIMTRAIN_PROFILES_DIR"]
    return {"config": config, "rows": rows}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |error|, median signed error, the worst |error| and how many rows are within 5 %, per process count."""
    out: dict[str, Any] = {}
    for n in sorted({r["processes"] for r in rows}):
        errs = [r["error"] for r in rows if r["processes"] == n]
        out[str(n)] = {"rows": len(errs), "median_abs_error": statistics.median(abs(e) for e in errs),
                       "median_signed_error": statistics.median(errs), "max_abs_error": max(abs(e) for e in errs),
                       "within_5pct": sum(abs(e) < 0.05 for e in errs)}
    return out


def markdown(rows: list[dict[str, Any]], summ: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table of one grid run."""
    lines = [f"# CPU loop grid ({meta['date']}, {meta['clock']} clock for one process, wall for DDP; batches of "
             f"{meta['steps']} and {meta['ddp_steps']} steps)", "",
             "| config | layers | seq | vocab | q/kv heads | b | processes | measured s | predicted s | of which wait | "
             "error | before/after | CPU share | steal |", "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r['config']} | {r['layers']} | {r['seq_len']} | {r['vocab']} | {r['gqa']} | "
                     f"{r['micro_batch_size']} | {r['processes']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | "
                     f"{r.get('sync_wait_s', 0.0):.3f} | "
                     f"{100 * r['error']:+.1f} % | {100 * r['repeatability']:.1f} % | "
                     f"{min(r['cpu_share']):.2f} | {100 * max(r['steal']):.1f} % |")
    lines += ["", "| processes | rows | median abs. error | median signed error | worst | within 5 % |",
              "|---|---|---|---|---|---|"]
    for n, s in summ.items():
        lines.append(f"| {n} | {s['rows']} | {100 * s['median_abs_error']:.1f} % | "
                     f"{100 * s['median_signed_error']:+.1f} % | {100 * s['max_abs_error']:.1f} % | "
                     f"{s['within_5pct']}/{s['rows']} |")
    lines += ["", "before/after: how far apart the medians of the real step measured before and after the "
              "calibration are (the real step's own repeatability); of which wait: the predicted wait for the slower "
              "rank (simtrain.engine.sync_wait); CPU share: the share of the step's wall time "
              "the process ran (below 1: other processes held the core); steal: CPU time the hypervisor stole."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/cpu_loop_grid.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=sorted(str(f) for f in GRID.glob("*.yaml")))
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ddp-configs", nargs="*", default=[], metavar="STEM",
                   help="configs (file stems) that also run on 2 processes when --processes is 1 alone")
    p.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.THREAD_CPU.value)
    p.add_argument("--steps", type=int, default=5, help="timed steps per batch, one process")
    # 20-30 % of this VM's DDP steps stall 0.2-2 s (gloo's loopback TCP; benchmarks/ddp_phases.py): a median of
    # five moved up to 30 % between the batches before and after one calibration
    p.add_argument("--ddp-steps", type=int, default=15, help="timed steps per batch, two processes")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output path without suffix (.json and .md are written)")
    p.add_argument("--work", help="keep the profiles and real-step results in this folder (default: a temporary one)")
    args = p.parse_args(argv)
    clock = Clock(args.clock)
    results: list[dict[str, Any]] = []
    text = ""
    with tempfile.TemporaryDirectory(prefix="simtrain-grid-") as tmp:
        work = Path(args.work or tmp)
        (work / "profiles" / "calibrated").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SIMTRAIN_PROFILES_DIR": str(work / "profiles")}
        for config in args.configs:
            procs = sorted({*args.processes, 2}) if Path(config).stem in args.ddp_configs else args.processes
            res = one_config(config, procs, clock, {1: args.steps, 2: args.ddp_steps}, args.warmup, work, env)
            for r in res["rows"]:
                print(f"{r['config']}: {r['processes']} process(es) measured {r['measured_s']:.3f} s, predicted "
                      f"{r['predicted_s']:.3f} s, error {100 * r['error']:+.1f} %", flush=True)
            results.append(res)
            text = write_tables([r for res in results for r in res["rows"]], clock, args)  # after each config
    print(text)
    return 0


def write_tables(rows: list[dict[str, Any]], clock: Clock, args: argparse.Namespace) -> str:
    """Write OUT.json and OUT.md of the rows so far (atomically); returns the markdown."""
    summ = summary(rows)
    meta = {"date": time.strftime("%Y-%m-%d"), "clock": clock.value, "steps": args.steps, "ddp_steps": args.ddp_steps,
            "warmup": args.warmup}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out.with_suffix(".json"), json.dumps({**meta, "summary": summ, "rows": rows}, indent=2))
    text = markdown(rows, summ, meta)
    write_atomic(out.with_suffix(".md"), text)
    return text


if __name__ == "__main__":
    sys.exit(main())
