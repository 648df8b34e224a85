"""How far off a prediction is likely to be: simtrain's own step-time error on measured runs like it.

No peer simulator reports calibrated uncertainty (reference peer-simulators.md, "Gaps"); simtrain
reports an empirical one. ``simtrain validate`` on measured runs gives each simulated run's signed
step-time error e = (predicted - measured) / measured (issue 5). For a new prediction T the n runs
most like it are chosen, their errors sorted e(1) <= ... <= e(n), and the measured step time is
likely in

    [T / (1 + e(k)), T / (1 + e(j))],   j = max(1, floor(0.1 (n + 1))),  k = min(n, ceil(0.9 (n + 1)))

a distribution-free prediction interval from order statistics (split conformal prediction, Vovk,
Gammerman & Shafer 2005; Lei et al. 2018, "Distribution-free predictive inference for regression",
JASA 113: if the new run's error is exchangeable with theirs, it falls between e(j) and e(k) with
probability (k - j) / (n + 1), the band's ``coverage``: 80 % or more once n >= 9, where the band is
the runs' whole error range). Percentiles of the sample instead would cover only ~0.8 (n - 1)/(n + 1)
of new runs: 46 of 61 (75 %) in a leave-one-out check on the published runs, against 53 of 61 (87 %)
for this interval, whose promised coverage averages 83 % there (``tests/test_uncertainty.py``).

"Like it" means the same software-stack family (the stack name before its first dash: megatron,
torchtitan, composer, deepspeed, pytorch), dense or MoE, and the same GPU profile; the GPU, then the
family are dropped in turn until at least ``MIN_RUNS`` runs remain. Dense and MoE runs are never
mixed (MoE errors are larger): with fewer MoE runs than that, the band is their whole range, with the
lower ``coverage`` that n gives. The band says how well the model has done on such runs, nothing
more: it moves no prediction, and runs unlike every published one (a new GPU, a new stack) get the
band of the nearest group, which ``basis`` names.

A new run is one simtrain was never shaped on, so only errors of such runs are exchangeable with its own.
Split conformal prediction needs calibration residuals from data the model was not fitted to (Papadopoulos
et al. 2002, "Inductive confidence machines for regression", ECML; Lei et al. 2018, sec. 2.2): residuals
of the data a model was shaped on understate its error on new data (the optimism of the apparent error,
Efron 1986, JASA 81; Hastie, Tibshirani & Friedman 2009, "The Elements of Statistical Learning", sec. 7.4),
and calibrating on a different distribution than the test one loses coverage by up to the distance
between the two (Barber, Candes, Ramdas & Tibshirani 2023, "Conformal prediction beyond
exchangeability", Ann. Statist. 51; Tibshirani et al. 2019, "Conformal prediction under covariate shift",
NeurIPS). Each row is therefore ``Sample.IN`` (the visible published runs: simtrain's mechanisms and
constants were chosen while looking at their errors) or ``Sample.OUT`` (the archive, a user's own runs),
and of the runs chosen above only the out-of-sample ones are kept when there are at least ``MIN_RUNS`` of
them. Otherwise all are kept, and where some are in sample the band is widened, like an unknown stack's
below, by how far the model's bias moves from in-sample to out-of-sample runs of the kind (``sample_shift``:
the difference of their median ln(1 + e), each side with at least ``SPREAD_MIN_RUNS`` runs; a new run's
bias relative to the in-sample runs may be that large, either way) [derived: the error table in use; in the
packaged tables of 2026-12-05, x1.004 for dense runs (medians -4.65 % over 57 in-sample runs, -4.25 % over 29
out-of-sample ones) and x1.087 for MoE runs (4 and 32), whose bands hold no in-sample run]. With no
out-of-sample run of the kind the band is the in-sample runs' own, and ``basis`` says so. In aggregate over
the packaged tables (``tests/test_uncertainty.py``): leaving out one source at a time, 113 of 122 runs fell
in their band (93 %, 83 % promised) against 107 with every run taken alike; one run at a time, 105 of 122
(86 %, 82 %); the published runs' bands on the archive, 50 of 61 (82 %, 72 % promised: four MoE runs), the
archive's on the published runs, 52 of 61 (85 %, 80 %).

A run whose framework has no stack profile (a JAX stack such as MaxText; ``simtrain validate`` maps it to
a fallback preset) is simulated with a stack it does not run, so its band is widened
(``band_for(..., stack_profiled=False)``): on the ratio scale ln(1 + e), each bound moves out by the
spread of the model's bias across the profiled stacks, the largest difference between two stacks'
median ln(1 + e) over the stacks with at least ``SPREAD_MIN_RUNS`` runs of a kind (``stack_spread``):
an unknown stack's bias relative to the fallback may be as large as the largest seen between two
profiled stacks, either way [derived: the error table in use; x1.096 in the packaged tables of 2026-12-06,
between the dense runs of composer-fsdp, median -8.62 %, and megatron-core, +0.18 %].
A run on a profiled stack whose family has no run among those chosen (a user's table of Megatron runs only,
asked for a torchtitan run) is widened the same way: the table cannot show that stack's bias. Leaving out
one source at a time, this rule holds 113 of 122 runs against 107 without it.

The packaged tables hold the visible rows of the project's published-runs validation set
(``simtrain/data/published_errors.csv``: ``simtrain validate validation/published_runs.csv
--error-table``) and of the out-of-sample runs shipped with the tests
(``simtrain/data/megatron_bridge_errors.csv``: the same on ``tests/data/megatron_bridge_archive_runs.csv``,
Megatron-Bridge's archived H100 and Blackwell runs); ``python -m simtrain.validation.regenerate`` rebuilds
both, and tests rebuild them from fresh validations (with ``SIMTRAIN_VALIDATION=1``, minutes; a subset of
the first in every run) and fail when the model's errors moved. A user's
own measured runs give their own table the same way (``--error-table`` on validate, then on simulate),
out of sample unless an optional ``sample`` column (``in-sample`` / ``out-of-sample``) says otherwise.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simtrain.engine.results import ErrorBand
from simtrain.spec.errors import ConfigError, problem

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pandas as pd

#: The table shipped with simtrain: simtrain's errors on the visible published runs.
PACKAGED_TABLE = Path(__file__).resolve().parents[1] / "data" / "published_errors.csv"
#: Shipped beside it: the errors on the out-of-sample runs of tests/data/megatron_bridge_archive_runs.csv.
ARCHIVE_TABLE = PACKAGED_TABLE.with_name("megatron_bridge_errors.csv")
#: Columns of an error table, in file order.
COLUMNS = ("run_id", "source", "gpu_type", "stack", "moe", "step_time_error_pct")
#: Target coverage of the band: the share of new runs like these whose measured step time falls inside.
COVERAGE = 0.8
#: Fewest runs a group needs before a narrower group is preferred to a wider one: the smallest n whose
#: whole error range covers COVERAGE of new runs ((n - 1) / (n + 1) >= 0.8) [derived].
MIN_RUNS = 9
#: Fewest runs of one stack (and kind) whose median error counts in the spread across stacks: the fewest
#: whose median is a middle value, not an end of the sample, so one outlier cannot set it [convention].
#: The same floor holds for each side of the in-sample -> out-of-sample shift (``sample_shift``).
SPREAD_MIN_RUNS = 3
#: Optional column of an error table: each row's ``Sample`` ("in-sample" / "out-of-sample"); blank or absent,
#: the table's default (``read_error_table``).
SAMPLE_COLUMN = "sample"


class Sample(Enum):
    """Whether simtrain's mechanisms and constants were chosen while looking at a run's error."""

    IN = "in-sample"
    """Shaped on it: the visible published runs (``PACKAGED_TABLE``); its error understates a new run's."""
    OUT = "out-of-sample"
    """Never shaped on it: the archive (``ARCHIVE_TABLE``), a user's own runs; exchangeable with a new run's."""


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """One measured run's signed step-time error, with what selects it."""

    run_id: str
    source: str
    gpu_type: str
    family: str
    moe: bool
    error_pct: float
    stack: str = ""
    """The stack preset the run was simulated with (``megatron-te``); "" when not known."""
    sample: Sample = Sample.OUT
    """Whether the model was shaped on the run (default: no, as for a user's own measured runs)."""


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


def read_error_table(path: str | Path | None = None, sample: Sample | None = None) -> list[ErrorRow]:
    """The rows of an error table (default: the packaged ones, published then archived runs; none while
    they have not been built).

    Each row's ``Sample`` is its ``sample`` cell where the table has one, else ``sample``, else the table's:
    in-sample for ``PACKAGED_TABLE`` (the runs simtrain was shaped on), out-of-sample for any other file
    (the archive, a user's own runs: simtrain was not shaped on them).

    Raises:
        ConfigError: the file is missing or lacks a column of ``COLUMNS``, has a non-numeric error or a
            ``sample`` cell that is not a ``Sample``.
    """
    if path is None:
        return [row for table in (PACKAGED_TABLE, ARCHIVE_TABLE) if table.exists() for row in _read_table(table)]
    return _read_table(Path(path), sample)


def _read_table(p: Path, sample: Sample | None = None) -> list[ErrorRow]:
    """The rows of the error table at ``p`` (``read_error_table``'s errors)."""
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        packaged = p.resolve() == PACKAGED_TABLE
    except OSError as exc:
        raise ConfigError(problem("error_table", str(p), f"a readable CSV file ({exc.strerror})")) from exc
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        raise ConfigError(problem("error_table", str(p), f"a CSV with columns {', '.join(COLUMNS)}"))
    default = sample or (Sample.IN if packaged else Sample.OUT)
    return [_error_row(r, f"error_table line {i}", str(p), default) for i, r in enumerate(rows, start=2)]


def error_rows(frame: pd.DataFrame) -> list[ErrorRow]:
    """The ``ErrorRow`` of every run ``error_table`` keeps from a ``validate_runs`` frame."""
    return [_error_row({str(k): str(v) for k, v in r.items()}, f"validate row {r['run_id']}", "validate_runs")
            for r in error_table(frame).to_dict(orient="records")]


def _error_row(r: dict[str, str], where: str, origin: str, sample: Sample = Sample.OUT) -> ErrorRow:
    """An error-table row of strings (a CSV's cells) as an ErrorRow of ``Sample`` ``sample`` unless its
    ``sample`` cell says otherwise; ConfigError at ``where`` (in ``origin``) for an error that is not a
    percentage above -100 or a ``sample`` cell that is not a ``Sample``."""
    try:
        err = float(r["step_time_error_pct"])
    except ValueError:
        err = math.nan
    if not math.isfinite(err) or err <= -100.0:
        raise ConfigError(problem(f"{where}.step_time_error_pct", r["step_time_error_pct"],
                                  f"a signed percentage above -100 ({origin})"))
    cell = str(r.get(SAMPLE_COLUMN) or "").strip().lower()
    if cell:
        try:
            sample = Sample(cell)
        except ValueError:
            raise ConfigError(problem(f"{where}.{SAMPLE_COLUMN}", r[SAMPLE_COLUMN],
                                      f"one of {', '.join(s.value for s in Sample)} or blank ({origin})")) from None
    return ErrorRow(r["run_id"], r["source"], r["gpu_type"].strip().lower(), stack_family(r["stack"]),
                    r["moe"].strip().lower() in ("true", "1", "yes"), err, str(r["stack"]).strip().lower(), sample)


def _like(rows: list[ErrorRow], family: str, moe: bool, gpu: str) -> tuple[list[ErrorRow], str]:
    """The runs most like (family, moe, gpu): the narrowest group with at least MIN_RUNS runs, else
    every run of the same kind (dense or MoE), and how they were chosen."""
    kind = "MoE" if moe else "dense"
    tiers = (
        (lambda r: r.family == family and r.moe == moe and r.gpu_type == gpu, f"{family} stacks, {kind}, {gpu}"),
        (lambda r: r.family == family and r.moe == moe, f"{family} stacks, {kind}, any GPU"),
    )
    for keep, basis in tiers:
        chosen = [r for r in rows if keep(r)]
        if len(chosen) >= MIN_RUNS:
            return chosen, basis
    return [r for r in rows if r.moe == moe], f"{kind} models, any stack and GPU"


def order_statistic_bounds(n: int, coverage: float = COVERAGE) -> tuple[int, int]:
    """1-based ranks (j, k) of the sorted errors bounding a two-sided prediction interval of ``coverage``
    from n samples, equal tails, clipped to the sample: coverage achieved = (k - j) / (n + 1)."""
    tail = (1.0 - coverage) / 2.0
    # rounded first: (1 - 0.8) / 2 * 20 is 1.9999999999999996 in floating point, not 2
    lo, hi = round(tail * (n + 1), 9), round((1.0 - tail) * (n + 1), 9)
    return max(1, math.floor(lo)), min(n, math.ceil(hi))


def band_for(step_time_s: float, stack: str, moe: bool, gpu: str, rows: list[ErrorRow],
             stack_profiled: bool = True) -> ErrorBand | None:
    """The band of a prediction of ``step_time_s`` seconds for a new run on ``stack`` / ``gpu`` profile;
    None when fewer than two runs of its kind (dense or MoE) are known.

    Of the runs most like it (``_like``), only the out-of-sample ones when at least ``MIN_RUNS`` of them are
    there; else all of them, and when some were in sample the band is widened by ``sample_shift`` (module
    docstring). ``stack_profiled`` False: the run's framework has no stack profile and ``stack`` is the
    fallback it was simulated with; the band is widened by ``stack_spread``. ``basis`` says which runs and by
    how much it was widened; ``coverage`` stays that of the unwidened band (a lower bound)."""
    family = stack_family(stack)
    chosen, basis = _like(rows, family, moe, str(gpu).strip().lower())
    if len(chosen) < 2 or not step_time_s > 0:
        return None
    unseen = [r for r in chosen if r.sample is Sample.OUT]
    if MIN_RUNS <= len(unseen) < len(chosen):
        chosen, basis = unseen, f"{basis}; out-of-sample runs only"
    errs = sorted(r.error_pct / 100.0 for r in chosen)
    j, k = order_statistic_bounds(len(errs))
    lo, hi = errs[j - 1], errs[k - 1]
    seen = sum(r.sample is Sample.IN for r in chosen)
    if seen:
        shift = sample_shift(rows, moe)
        if shift is None:
            basis += f"; {seen} in sample, and no out-of-sample runs of the kind to measure how much that flatters"
        else:
            lo, hi = _widen(lo, hi, abs(shift))
            basis += (f"; {seen} in sample: widened x{math.exp(abs(shift)):.3f} either way, the shift of the model's "
                      f"median error from in-sample to out-of-sample runs")
    if not stack_profiled or not any(r.family == family for r in chosen):
        # a stack without a profile, or one the table has no runs of: the bias of its runs is unmeasured
        spread, stacks = stack_spread(rows)
        lo, hi = _widen(lo, hi, spread)
        why = "the framework has no stack profile" if not stack_profiled else "none of the runs is of its stack family"
        basis += (f"; {why}: widened x{math.exp(spread):.3f} either way, the spread of the model's median error "
                  f"across {stacks} profiled stacks" if stacks >= 2 else
                  f"; {why}, but the table shows no spread across stacks to widen by")
    return ErrorBand(low_s=step_time_s / (1.0 + hi), high_s=step_time_s / (1.0 + lo),
                     error_low_pct=100.0 * lo, error_median_pct=100.0 * float(np.median(errs)),
                     error_high_pct=100.0 * hi, coverage=(k - j) / (len(errs) + 1), runs=len(errs),
                     basis=f"{len(errs)} measured runs ({basis})")


def _widen(lo: float, hi: float, by: float) -> tuple[float, float]:
    """Error bounds (fractions) moved out by ``by`` on the ratio scale ln(1 + e), either way."""
    return (1.0 + lo) * math.exp(-by) - 1.0, (1.0 + hi) * math.exp(by) - 1.0


def sample_shift(rows: list[ErrorRow], moe: bool) -> float | None:
    """How far the model's bias moves from runs it was shaped on to runs it was not, on the ratio scale:
    the median of ln(1 + e) over the out-of-sample runs of the kind (dense or MoE) minus that over its
    in-sample runs; None unless each side has at least ``SPREAD_MIN_RUNS`` runs."""
    sides = [[math.log1p(r.error_pct / 100.0) for r in rows if r.moe == moe and r.sample is s] for s in Sample]
    if min(len(v) for v in sides) < SPREAD_MIN_RUNS:
        return None
    inside, outside = (float(np.median(v)) for v in sides)
    return outside - inside


def stack_spread(rows: list[ErrorRow]) -> tuple[float, int]:
    """(spread, stacks): how far the model's bias moves from one profiled stack to another, on the ratio scale.

    For each kind (dense, MoE), the median of ln(1 + e) over each stack preset's runs of that kind with at
    least ``SPREAD_MIN_RUNS`` of them; ``spread`` is the largest range, max - min, of those medians within a
    kind (0.0 when no kind has two such stacks), ``stacks`` the number of stacks behind it."""
    best, count = 0.0, 0
    for moe in (False, True):
        groups: dict[str, list[float]] = {}
        for r in rows:
            if r.moe == moe and r.stack:
                groups.setdefault(r.stack, []).append(math.log1p(r.error_pct / 100.0))
        medians = [float(np.median(v)) for v in groups.values() if len(v) >= SPREAD_MIN_RUNS]
        if len(medians) >= 2 and max(medians) - min(medians) > best:
            best, count = max(medians) - min(medians), len(medians)
    return best, count


def leave_one_out(rows: list[ErrorRow]) -> dict[str, Any]:
    """How the likely range does on measured runs it was not built from: each run's band from the
    others, and whether its measured step time fell inside. ``runs``: runs that got a band; ``held``:
    those inside; ``held_pct`` vs ``promised_pct``, the bands' mean coverage (None without runs)."""
    return _tally(band_held(r, rows[:i] + rows[i + 1:]) for i, r in enumerate(rows))


def transfer(table: list[ErrorRow], runs: list[ErrorRow]) -> dict[str, Any]:
    """How the likely range built from ``table`` alone does on other measured ``runs`` (another set, a source
    left out): ``leave_one_out``'s counts, each run's band from ``table``."""
    return _tally(band_held(r, table) for r in runs)


def band_held(run: ErrorRow, table: list[ErrorRow]) -> tuple[bool, float] | None:
    """(inside, coverage): whether a measured run's step time lies in the band ``table`` gives its prediction
    (on the run's stack family, kind and GPU), and the band's coverage; None when it gets no band."""
    b = band_for(1.0, run.family, run.moe, run.gpu_type, table)
    if b is None:
        return None
    return b.low_s <= 1.0 / (1.0 + run.error_pct / 100.0) <= b.high_s, b.coverage


def _tally(outcomes: Iterable[tuple[bool, float] | None]) -> dict[str, Any]:
    """``leave_one_out``'s dict of ``band_held`` outcomes."""
    got = [o for o in outcomes if o is not None]
    n, held = len(got), sum(inside for inside, _ in got)
    return {"runs": n, "held": held, "held_pct": 100.0 * held / n if n else None,
            "promised_pct": 100.0 * sum(c for _, c in got) / n if n else None}
