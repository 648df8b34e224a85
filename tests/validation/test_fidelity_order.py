"""validate_runs's worker pool starts the costliest rows first (longest processing time first) and
still returns the rows in the file's order; ``work_estimate`` is the cost it orders by."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import simtrain.validation.fidelity as fidelity
from simtrain.validation.fidelity import validate_runs, work_estimate

from .conftest import SMALL_ROWS, write_csv


def _row(run_id: str, **cells: str) -> dict[str, str]:
    base = {k: v for k, v in SMALL_ROWS[0].items() if k != "run_id"}
    return {"run_id": run_id, **base, **cells}


def test_work_estimate_grows_with_micro_batches_and_layers_and_is_zero_without_a_run() -> None:
    """The estimate is micro-batches x layers (the engine's ops grow with both); a row that does not
    parse to a run (no layer count) costs nothing to simulate."""
    one = work_estimate(_row("a"))
    assert one == 1 * 4  # 8 sequences on dp=8: one micro-batch of a 4-layer model
    assert work_estimate(_row("b", global_batch_seqs="32")) == 4 * one
    assert work_estimate(_row("c", n_layers="8")) == 2 * one
    assert work_estimate(SMALL_ROWS[3]) == 0.0  # tiny-no-layers: not simulatable


class _InlinePool:
    """A ProcessPoolExecutor stand-in that runs each submitted call at once, recording the order."""

    submitted: list[str] = []

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers

    def __enter__(self) -> _InlinePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def submit(self, fn: Callable[..., Any], row: dict[str, str]) -> Future[Any]:
        _InlinePool.submitted.append(row["run_id"])
        fut: Future[Any] = Future()
        fut.set_result(fn(row))
        return fut


def test_pool_gets_the_costliest_rows_first_and_the_table_keeps_file_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row("small"), _row("big", global_batch_seqs="64"), SMALL_ROWS[3], _row("medium", global_batch_seqs="16")]
    csv = write_csv(tmp_path / "runs.csv", rows)
    _InlinePool.submitted = []
    monkeypatch.setattr(fidelity, "ProcessPoolExecutor", _InlinePool)
    frame, _ = validate_runs(csv, workers=2)
    assert _InlinePool.submitted == ["big", "medium", "small", "tiny-no-layers"]
    assert list(frame["run_id"]) == ["small", "big", "tiny-no-layers", "medium"]
    assert list(frame["status"]) == ["ok", "ok", frame["status"][2], "ok"]
    assert frame["status"][2].startswith("not simulatable")
