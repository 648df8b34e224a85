"""Rebuild the packaged error tables behind every likely range, by one command (issue 29 part 6)::

    python -m simtrain.validation.regenerate            # both tables, from fresh validations (minutes)
    python -m simtrain.validation.regenerate --check    # only compare: exit 1 when a table is not today's

The tables are outputs of the model, never goldens edited by hand:

- ``simtrain/data/published_errors.csv``: the visible rows of the published-runs set (``--published``;
  default ``$SIMTRAIN_RUNS_CSV``, else ``shared/validation/published_runs.csv`` beside the checkout);
- ``simtrain/data/megatron_bridge_errors.csv``: the out-of-sample Megatron-Bridge archive runs
  (``--archive``; default ``tests/data/megatron_bridge_archive_runs.csv``).

Each is ``simtrain.studies.uncertainty.error_table`` of ``validate_runs`` on its CSV (the same as
``simtrain validate CSV --error-table FILE``). Both validations finish before either file is written, and
each file is written atomically (``simtrain.engine.trace.write_atomic``): an interrupted run leaves the old
tables, never half of one. The frozen hold-out (``tests/data/holdout_runs.csv``) is no input.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from simtrain.engine.trace import write_atomic
from simtrain.spec.errors import ConfigError, Problem
from simtrain.studies.uncertainty import ARCHIVE_TABLE, PACKAGED_TABLE, error_table
from simtrain.validation.csv_cells import is_visible
from simtrain.validation.fidelity import validate_runs

#: The checkout's root (simtrain/validation/regenerate.py -> the folder holding simtrain/).
ROOT = Path(__file__).resolve().parents[2]
#: The published runs: ``$SIMTRAIN_RUNS_CSV``, else the shared folder beside the checkout.
DEFAULT_PUBLISHED = ROOT.parent / "shared" / "validation" / "published_runs.csv"
#: The Megatron-Bridge archive runs shipped with the tests.
DEFAULT_ARCHIVE = ROOT / "tests" / "data" / "megatron_bridge_archive_runs.csv"


@dataclass(frozen=True, slots=True)
class Table:
    """One packaged error table: the runs CSV it is built from and the file it is written to."""

    runs_csv: Path
    path: Path


def tables(published: str | Path | None = None, archive: str | Path | None = None) -> tuple[Table, Table]:
    """The two packaged tables with their inputs (defaults in the module docstring)."""
    pub = Path(published or os.environ.get("SIMTRAIN_RUNS_CSV") or DEFAULT_PUBLISHED)
    return Table(pub, PACKAGED_TABLE), Table(Path(archive or DEFAULT_ARCHIVE), ARCHIVE_TABLE)


def table_text(runs_csv: str | Path, workers: int | None = None) -> str:
    """The error table of ``runs_csv`` as the CSV text the packaged files hold.

    Raises:
        ConfigError: the runs CSV is missing or unreadable (``validate_runs``).
    """
    # only the visible rows: the table holds no other (``error_table``), so simulating the rest is wasted
    frame, _ = validate_runs(runs_csv, workers=workers, select=is_visible)
    return str(error_table(frame).to_csv(index=False))


def regenerate(published: str | Path | None = None, archive: str | Path | None = None, workers: int | None = None,
               check: bool = False) -> list[Path]:
    """Rebuild both packaged tables; return the files whose content changed (with ``check``, nothing is
    written: the files that would change).

    Raises:
        ConfigError: an input CSV is missing or unreadable; no table is written then.
    """
    todo = tables(published, archive)
    for t in todo:
        if not t.runs_csv.is_file():
            raise ConfigError(Problem("runs_csv", f"{str(t.runs_csv)!r} not found; it is the input of {t.path.name} "
                                                  "(give --published / --archive, or set SIMTRAIN_RUNS_CSV)"))
    fresh = [(t, table_text(t.runs_csv, workers)) for t in todo]  # every validation first, then the writes
    changed = [t.path for t, text in fresh if not t.path.is_file() or t.path.read_text(encoding="utf-8") != text]
    if not check:
        for t, text in fresh:
            if t.path in changed:
                write_atomic(t.path, text)
    return changed


def main(argv: list[str] | None = None) -> int:
    """``python -m simtrain.validation.regenerate``: 0 when done (or, with --check, when both tables are
    today's), 1 when --check finds a table that is not, 2 for a missing input."""
    ap = argparse.ArgumentParser(prog="python -m simtrain.validation.regenerate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--published", metavar="CSV", help=f"published runs (default: $SIMTRAIN_RUNS_CSV or {DEFAULT_PUBLISHED})")
    ap.add_argument("--archive", metavar="CSV", help=f"Megatron-Bridge archive runs (default: {DEFAULT_ARCHIVE})")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: one per CPU); the tables are "
                                                              "the same for any count")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a table is not today's")
    args = ap.parse_args(argv)
    try:
        changed = regenerate(args.published, args.archive, args.workers, args.check)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'differs' if args.check else 'rewritten'}: {path}")
    if not changed:
        print("both error tables are today's")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
