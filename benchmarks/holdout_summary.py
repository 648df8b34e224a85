"""Aggregate step-time accuracy on the frozen hold-out (issue 29), and nothing per row.

``tests/data/holdout_runs.csv`` is a second out-of-sample set: its per-row errors must not be looked
at (nor used to motivate a model change) until the issue's end. This script therefore prints only
counts and aggregate statistics of the signed step-time error (predicted - measured) / measured in %:

- rows, simulated, compared (a measured step time to compare with), not simulatable, errors;
- median, p90 (nearest rank, as ``simtrain.validation.fidelity.error_stats``) and mean of |error|;
- the signed median and the share of compared rows predicted too fast (signed error < 0);
- the coverage of the likely range simtrain ships (``simtrain.studies.uncertainty.band_for`` on the packaged
  error tables of the published and Megatron-Bridge runs): how many compared rows' measured step time
  falls in the band of their prediction, against the bands' promised coverage; and the leave-one-out
  coverage that ``simtrain validate`` reports on the file itself.

For rows that did not simulate it lists the run id and the status (the reason), which carries no error.

Usage (from the repository root)::

    python benchmarks/holdout_summary.py                       # simulates the hold-out (minutes)
    python benchmarks/holdout_summary.py --json holdout.json   # reads `simtrain validate --json` output
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = ROOT / "tests" / "data" / "holdout_runs.csv"


def aggregate(rows: list[dict[str, Any]], likely_range: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts and aggregate |step-time error| statistics (%) of validate's rows; no per-row value."""
    statuses = [str(r.get("status") or "") for r in rows]
    errors = [float(e) for r in rows if r.get("status") == "ok"
              and (e := r.get("step_time_error_pct")) is not None and math.isfinite(float(e))]
    absolute = sorted(abs(e) for e in errors)
    out: dict[str, Any] = {
        "rows": len(rows),
        "simulated": statuses.count("ok"),
        "compared": len(errors),
        "not_simulatable": sum(s.startswith("not simulatable") for s in statuses),
        "errors": sum(s.startswith("error") for s in statuses),
        "median_abs_pct": statistics.median(absolute) if absolute else None,
        "p90_abs_pct": absolute[min(len(absolute) - 1, max(0, math.ceil(0.9 * len(absolute)) - 1))]
        if absolute else None,
        "mean_abs_pct": statistics.fmean(absolute) if absolute else None,
        "signed_median_pct": statistics.median(errors) if errors else None,
        "share_too_fast_pct": 100.0 * sum(e < 0 for e in errors) / len(errors) if errors else None,
        "failed": [(str(r.get("run_id")), s) for r, s in zip(rows, statuses, strict=True) if s != "ok"],
    }
    if likely_range and likely_range.get("runs"):
        out["likely_range"] = {k: likely_range.get(k) for k in ("runs", "held", "held_pct", "promised_pct")}
    out["shipped_range"] = shipped_range_coverage(rows)
    return out


def shipped_range_coverage(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many compared rows' measured step time lies in the band simtrain's packaged error tables give
    their prediction (``runs`` with a band, ``held`` inside, ``promised_pct`` the bands' mean coverage)."""
    from simtrain.studies.uncertainty import band_for, read_error_table

    table = read_error_table()
    runs, held, promised = 0, 0, 0.0
    for r in rows:
        pred, meas = r.get("predicted_step_time_s"), r.get("measured_step_time_s")
        if r.get("status") != "ok" or not pred or not meas:
            continue
        band = band_for(float(pred), str(r.get("stack")), bool(r.get("moe")), str(r.get("gpu_type")), table,
                        stack_profiled=r.get("stack_profiled") is not False)  # widened for an unknown stack
        if band is None:
            continue
        runs += 1
        held += band.low_s <= float(meas) <= band.high_s
        promised += band.coverage
    return {"runs": runs, "held": held, "held_pct": 100.0 * held / runs if runs else None,
            "promised_pct": 100.0 * promised / runs if runs else None}


def render(agg: dict[str, Any]) -> str:
    """The aggregate as text lines."""
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:.1f}"

    lines = [f"rows {agg['rows']}, simulated {agg['simulated']}, compared {agg['compared']}, "
             f"not simulatable {agg['not_simulatable']}, errors {agg['errors']}",
             f"|step-time error| %: median {f(agg['median_abs_pct'])}, p90 {f(agg['p90_abs_pct'])}, "
             f"mean {f(agg['mean_abs_pct'])}",
             f"signed median {f(agg['signed_median_pct'])} %, predicted too fast {f(agg['share_too_fast_pct'])} % "
             f"of compared rows"]
    sr = agg["shipped_range"]
    if sr["runs"]:
        lines.append(f"likely range shipped with simtrain (published + Megatron-Bridge error tables): measured step "
                     f"inside for {sr['held']} of {sr['runs']} ({f(sr['held_pct'])} %), promised "
                     f"{f(sr['promised_pct'])} % on average")
    lr = agg.get("likely_range")
    if lr:
        lines.append(f"likely range (validate's leave-one-out on this file): held {lr['held']} of {lr['runs']} "
                     f"({f(lr['held_pct'])} %), promised {f(lr['promised_pct'])} % on average")
    for run_id, status in agg["failed"]:
        lines.append(f"not simulated: {run_id}: {status}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(HOLDOUT), help="runs CSV to simulate (default: the hold-out)")
    ap.add_argument("--json", help="read `simtrain validate --json` output instead of simulating")
    ap.add_argument("--workers", type=int, default=1, help="processes for the simulation (default 1)")
    args = ap.parse_args(argv)
    if args.json:
        data = json.loads(Path(args.json).read_text())
        rows, likely = data["rows"], data["summary"].get("likely_range")
    else:
        from simtrain.validation.fidelity import validate_runs

        frame, summary = validate_runs(args.csv, workers=args.workers)
        rows = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
        likely = summary.get("likely_range")
    print(render(aggregate(rows, likely)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
