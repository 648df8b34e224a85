"""CPU time per row of the validation tables CI simulates (not a pass/fail test).

Each row of a runs CSV goes through ``simtrain.validation.fidelity.evaluate_row`` (as ``validate_runs``
does, one process) and its CPU time (``time.process_time``: the machine may be shared, wall time would
count the other processes) is printed, with the total and the slowest rows.

    python benchmarks/bench_validate.py                          # the archive and the published runs
    python benchmarks/bench_validate.py --csv tests/data/megatron_bridge_archive_runs.csv --stride 3
    python benchmarks/bench_validate.py --out per_row.csv        # the per-row seconds as CSV as well
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from simtrain.validation.csv_cells import read_rows
from simtrain.validation.fidelity import evaluate_row

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = ROOT / "tests" / "data" / "megatron_bridge_archive_runs.csv"
PUBLISHED = ROOT.parent / "shared" / "validation" / "published_runs.csv"


def time_rows(path: Path, stride: int = 1, match: str = "") -> list[tuple[str, float, str]]:
    """(run_id, CPU seconds, status) of every ``stride``-th row of ``path`` whose run_id contains ``match``."""
    out = []
    for row in read_rows(path)[::stride]:
        if match not in row["run_id"]:
            continue
        t0 = time.process_time()
        result = evaluate_row(row)
        out.append((row["run_id"], time.process_time() - t0, str(result["status"])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", action="append", type=Path, help="runs CSV (repeatable; default: archive and published)")
    ap.add_argument("--stride", type=int, default=1, help="every n-th row only (default 1)")
    ap.add_argument("--match", default="", help="only rows whose run_id contains this text")
    ap.add_argument("--top", type=int, default=10, help="slowest rows listed per CSV (default 10)")
    ap.add_argument("--out", type=Path, help="write csv,run_id,cpu_s,status lines here")
    args = ap.parse_args(argv)
    lines = ["csv,run_id,cpu_s,status"]
    for path in args.csv or [ARCHIVE, PUBLISHED]:
        timed = time_rows(path, args.stride, args.match)
        total = sum(t for _, t, _ in timed)
        print(f"{path.name}: {len(timed)} rows, {total:.1f} CPU s, {total / max(len(timed), 1):.2f} CPU s per row")
        for rid, t, status in sorted(timed, key=lambda x: -x[1])[:args.top]:
            print(f"  {t:8.2f}  {rid}  ({status[:40]})")
        lines += [f"{path.name},{rid},{t:.3f},{status.split(':')[0]}" for rid, t, status in timed]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
