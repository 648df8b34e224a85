"""Accuracy in the default test suite (issue 29 part 6): a small deterministic subset of the visible published
runs, simulated on every ``pytest -q``; the full tables run in CI (``SIMTRAIN_VALIDATION=1``).

The rule that picks the rows, fixed before looking at what they give: the packaged table of the visible rows
(``simtrain/data/published_errors.csv``) sorted by run id, every ``STRIDE``-th row from the first. Not rows
chosen for a low error, and never a row of the frozen hold-out (``tests/data/holdout_runs.csv``), which is no
input here. Seven rows today, one or more of BLOOM, Megatron-Bridge MoE, Megatron-LM, NeMo and torchtitan;
~17 CPU-seconds on this machine (one core).

Each row asserts two things: its predicted step-time error equals the table's (a regression guard: the model
moved, so rebuild the tables with ``python -m simtrain.validation.regenerate`` and say why), and its prediction
lies within the table's own |error| of the measured step time (a fact about the measurement, independent of
how the table was written).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simtrain.studies.uncertainty import PACKAGED_TABLE
from simtrain.validation.csv_cells import read_rows
from simtrain.validation.fidelity import evaluate_row

#: Every STRIDE-th visible row by run id.
STRIDE = 10

_TABLE = pd.read_csv(PACKAGED_TABLE).sort_values("run_id", kind="stable").reset_index(drop=True)
SUBSET = _TABLE.iloc[::STRIDE]


def test_the_subset_follows_its_rule() -> None:
    ids = sorted(pd.read_csv(PACKAGED_TABLE)["run_id"])
    assert list(SUBSET["run_id"]) == ids[::STRIDE] and len(SUBSET) == -(-len(ids) // STRIDE) >= 6
    holdout = Path(__file__).resolve().parents[1] / "data" / "holdout_runs.csv"
    held_ids = set(pd.read_csv(holdout, usecols=["run_id"])["run_id"])  # the ids only: no hold-out row is simulated
    assert not held_ids & set(SUBSET["run_id"])


@pytest.fixture(scope="module")
def published_rows(published_csv: Path) -> dict[str, dict[str, str]]:
    return {r["run_id"]: r for r in read_rows(published_csv)}


@pytest.mark.parametrize(("run_id", "table_error_pct"), list(zip(SUBSET["run_id"], SUBSET["step_time_error_pct"],
                                                                 strict=True)),
                         ids=list(SUBSET["run_id"]))
def test_published_row_prediction(published_rows: dict[str, dict[str, str]], run_id: str,
                                  table_error_pct: float) -> None:
    out = evaluate_row(published_rows[run_id])
    assert out["status"] == "ok" and out["visible"], out["status"]
    predicted, measured = out["predicted_step_time_s"], out["measured_step_time_s"]
    # regression: the packaged table holds the error rounded to 0.01 points
    assert out["step_time_error_pct"] == pytest.approx(table_error_pct, abs=0.005 + 1e-9)
    # fact: the prediction is within the table's own error of what was measured
    assert abs(predicted - measured) <= (abs(table_error_pct) + 0.005) / 100.0 * measured
