"""How far off a prediction is likely to be: simtrain's own step-time error on published runs like it.

No peer simulator reports calibrated uncertainty (reference peer-simulators.md, "Gaps"); simtrain
reports an empirical one. ``simtrain validate`` on measured runs gives each simulated run's signed
step-time error e = (predicted - measured) / measured (issue 5). For a new prediction the runs most
like it are chosen, and the measured step time it would most likely see lies in

    [predicted / (1 + e_p90), predicted / (1 + e_p10)]

with e_p10 / e_p90 the 10th / 90th percentiles (linear interpolation, ``numpy.percentile``) of their
signed errors: 8 in 10 of those runs fell inside such a range around their own prediction. "Like it"
means the same software-stack family (the stack name before its first dash: megatron, torchtitan,
composer, deepspeed, pytorch), dense or MoE, and the same GPU profile; the GPU, then the family, then
dense/MoE are dropped in turn until at least ``MIN_RUNS`` runs remain. The band says how well the
model has done on such runs, nothing more: it moves no prediction, and runs unlike every published
one (a new GPU, a new stack) get the band of the nearest group, which the ``basis`` names.

The packaged table (``simtrain/data/published_errors.csv``) holds the visible rows of the project's
published-runs validation set (``simtrain validate validation/published_runs.csv --error-table``);
a test rebuilds it from a fresh validation and fails when the model's errors moved. A user's own
measured runs give their own table the same way (``--error-table`` on validate, then on simulate).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simtrain.errors import ConfigError, problem

if TYPE_CHECKING:
    import pandas as pd

#: The table shipped with simtrain: simtrain's errors on the visible published runs.
PACKAGED_TABLE = Path(__file__).resolve().parent / "data" / "published_errors.csv"
#: Columns of an error table, in file order.
COLUMNS = ("run_id", "source", "gpu_type", "stack", "moe", "step_time_error_pct")
#: Fewest runs a band is computed from: with four, the 10th and 90th percentiles already fall between
#: the two smallest and the two largest errors rather than on a single run [choice, not fitted].
MIN_RUNS = 4
#: Percentiles of the signed error that bound the band.
LOW_PCT, HIGH_PCT = 10.0, 90.0


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """One measured run's signed step-time error, with what selects it."""

    run_id: str
    source: str
    gpu_type: str
    family: str
    moe: bool
    error_pct: float


@dataclass(frozen=True, slots=True)
class ErrorBand:
    """The likely measured step time of a prediction, from the errors of ``runs`` published runs.

    ``low_s`` / ``high_s``: seconds; ``error_*_pct``: signed errors (predicted vs measured, percent) of
    those runs at the 10th, 50th and 90th percentiles; ``basis``: which runs they were.
    """

    low_s: float
    high_s: float
    error_p10_pct: float
    error_p50_pct: float
    error_p90_pct: float
    runs: int
    basis: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the field names."""
        return asdict(self)


def stack_family(stack: str) -> str:
    """The stack's family: its name before the first dash (``megatron-te`` -> ``megatron``)."""
    return str(stack).strip().lower().split("-", 1)[0]


def error_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The error table of a ``validate_runs`` frame: its visible, simulated rows with a measured step
    time, in ``COLUMNS`` (errors rounded to 0.01 %, so the file does not churn on float noise)."""
    ok = frame[(frame["status"] == "ok") & frame["visible"].astype(bool) & frame["step_time_error_pct"].notna()]
    out = ok.loc[:, list(COLUMNS)].copy()
    out["moe"] = out["moe"].astype(bool)
    out["step_time_error_pct"] = out["step_time_error_pct"].astype(float).round(2)
    return out.reset_index(drop=True)


def read_error_table(path: str | Path | None = None) -> list[ErrorRow]:
    """The rows of an error table (default: the packaged one; none while it has not been built).

    Raises:
        ConfigError: the file is missing or lacks a column of ``COLUMNS`` or has a non-numeric error.
    """
    if path is None and not PACKAGED_TABLE.exists():
        return []
    p = Path(path) if path is not None else PACKAGED_TABLE
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(problem("error_table", str(p), f"a readable CSV file ({exc.strerror})")) from exc
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        raise ConfigError(problem("error_table", str(p), f"a CSV with columns {', '.join(COLUMNS)}"))
    return [_error_row(r, p, i) for i, r in enumerate(rows, start=2)]


def _error_row(r: dict[str, str], path: Path, line: int) -> ErrorRow:
    try:
        err = float(r["step_time_error_pct"])
    except ValueError:
        err = math.nan
    if not math.isfinite(err) or err <= -100.0:
        raise ConfigError(problem(f"error_table line {line}.step_time_error_pct", r["step_time_error_pct"],
                                  f"a signed percentage above -100 ({path})"))
    return ErrorRow(r["run_id"], r["source"], r["gpu_type"].strip().lower(), stack_family(r["stack"]),
                    r["moe"].strip().lower() in ("true", "1", "yes"), err)


def _like(rows: list[ErrorRow], family: str, moe: bool, gpu: str) -> tuple[list[ErrorRow], str]:
    """The runs most like (family, moe, gpu) with at least MIN_RUNS of them, and how they were chosen."""
    kind = "MoE" if moe else "dense"
    tiers = (
        (lambda r: r.family == family and r.moe == moe and r.gpu_type == gpu, f"{family} stacks, {kind}, {gpu}"),
        (lambda r: r.family == family and r.moe == moe, f"{family} stacks, {kind}, any GPU"),
        (lambda r: r.moe == moe, f"{kind} models, any stack and GPU"),
    )
    for keep, basis in tiers:
        chosen = [r for r in rows if keep(r)]
        if len(chosen) >= MIN_RUNS:
            return chosen, basis
    return rows, "all runs"


def band_for(step_time_s: float, stack: str, moe: bool, gpu: str, rows: list[ErrorRow]) -> ErrorBand | None:
    """The band of a prediction of ``step_time_s`` seconds for a run on ``stack`` / ``gpu`` profile;
    None when the table has fewer than ``MIN_RUNS`` runs."""
    if len(rows) < MIN_RUNS or not step_time_s > 0:
        return None
    chosen, basis = _like(rows, stack_family(stack), moe, str(gpu).strip().lower())
    errs = np.array([r.error_pct for r in chosen], dtype=float) / 100.0
    p10, p50, p90 = (float(np.percentile(errs, q)) for q in (LOW_PCT, 50.0, HIGH_PCT))
    return ErrorBand(low_s=step_time_s / (1.0 + p90), high_s=step_time_s / (1.0 + p10),
                     error_p10_pct=100.0 * p10, error_p50_pct=100.0 * p50, error_p90_pct=100.0 * p90,
                     runs=len(chosen), basis=f"{len(chosen)} measured runs ({basis})")
