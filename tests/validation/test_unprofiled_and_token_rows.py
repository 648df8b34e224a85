"""Issue 29 parts 3 and 4 in validate's rows: a framework with no stack profile is named as such and gets a
wider likely range; a batch quoted in tokens that is not whole micro-batches is rounded, not an error row."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simtrain.studies.simulate import simulate
from simtrain.studies.uncertainty import (
    ARCHIVE_TABLE,
    PACKAGED_TABLE,
    SPREAD_MIN_RUNS,
    ErrorRow,
    band_for,
    read_error_table,
    stack_spread,
)
from simtrain.validation.csv_runs import parse_row
from simtrain.validation.fidelity import simulate_row, validate_runs

from .conftest import SMALL_ROWS

#: The NeMo row of the small CSV (GPT-tiny, TP 2, FP8 on H100), run by Megatron-Bridge: its stack is megatron-te,
#: the fallback too, so the same row with a JAX framework simulates identically and differs only in what it says
#: and its range (the row's own NeMo 24.07 is megatron-te-2024: gradients reduced in fp32).
NEMO = {**{k: str(v) for k, v in SMALL_ROWS[1].items()}, "framework": "Megatron-Bridge / NeMo 25.11"}
JAX = {**NEMO, "run_id": "tiny-maxtext", "framework": "MaxText (JAX/XLA, PGLE)"}


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def _independent_spread() -> float:
    """The spread across stacks computed from the packaged CSVs with pandas, apart from ``stack_spread``."""
    t = pd.concat([pd.read_csv(PACKAGED_TABLE), pd.read_csv(ARCHIVE_TABLE)])
    t["log_ratio"] = np.log1p(t["step_time_error_pct"] / 100.0)
    g = t.groupby(["moe", "stack"])["log_ratio"].agg(["count", "median"])
    g = g[g["count"] >= SPREAD_MIN_RUNS]
    ranges = [m.max() - m.min() for _, m in g.groupby(level="moe")["median"] if len(m) >= 2]
    return max(ranges)


def test_a_framework_without_a_profile_is_named_and_simulated_on_the_fallback() -> None:
    p = parse_row(JAX)
    assert p.status == "ok" and p.run is not None and not p.stack_profiled
    assert p.run.train.stack_name == "megatron-te"
    (note,) = [a for a in p.assumptions if a.startswith("framework")]
    assert note.startswith("framework 'MaxText (JAX/XLA, PGLE)' has no stack profile; simulated with stack "
                           "megatron-te") and "likely range widened" in note
    known = parse_row(NEMO)
    assert known.stack_profiled and not [a for a in known.assumptions if a.startswith("framework")]
    blank = parse_row({**NEMO, "framework": ""})
    assert not blank.stack_profiled and any(a.startswith("framework not given; simulated with") for a in blank.assumptions)
    titan = parse_row({**NEMO, "framework": "torchtitan"})  # a profile, with an assumption about it
    assert titan.stack_profiled and titan.run is not None and titan.run.train.stack_name == "torchtitan-eager"


def test_band_widening_closed_form() -> None:
    """Stack a at -10 % (three runs), stack b at 0 % (three): spread ln(1 / 0.9); a run on an unprofiled stack
    whose fallback group's band is [-10 %, 0 %] gets [0.9 x 0.9 - 1, 1 / 0.9 - 1] = [-19 %, +11.1 %]."""
    rows = [ErrorRow(f"a{i}", "t", "h100-sxm", "a", False, -10.0, "a") for i in range(3)]
    rows += [ErrorRow(f"b{i}", "t", "h100-sxm", "b", False, 0.0, "b") for i in range(3)]
    assert stack_spread(rows) == (pytest.approx(math.log(1 / 0.9)), 2)
    known = band_for(10.0, "a", False, "h100-sxm", rows)
    wide = band_for(10.0, "a", False, "h100-sxm", rows, stack_profiled=False)
    assert known is not None and wide is not None
    assert (known.error_low_pct, known.error_high_pct) == (pytest.approx(-10.0), pytest.approx(0.0))
    assert wide.error_low_pct == pytest.approx(-19.0) and wide.error_high_pct == pytest.approx(100 / 9)
    assert wide.low_s == pytest.approx(10.0 * 0.9) and wide.high_s == pytest.approx(10.0 / 0.81)
    assert wide.coverage == known.coverage and "no stack profile: widened x1.111" in wide.basis
    # one stack with enough runs: no spread to derive, said so, the band as it was
    one = band_for(10.0, "a", False, "h100-sxm", rows[:4], stack_profiled=False)
    assert one is not None and "no spread across stacks" in one.basis and one.error_low_pct == pytest.approx(-10.0)
    # a profiled stack the table has no runs of: its bias is as unmeasured, widened alike and said so
    other = band_for(10.0, "c-fsdp", False, "h100-sxm", rows)
    assert other is not None and (other.error_low_pct, other.error_high_pct) == (wide.error_low_pct, wide.error_high_pct)
    assert "none of the runs is of its stack family: widened x1.111" in other.basis
    lone = band_for(10.0, "c-fsdp", False, "h100-sxm", rows[:4])
    assert lone is not None and "its stack family, but the table shows no spread" in lone.basis


def test_packaged_spread_is_the_tables_own() -> None:
    spread, stacks = stack_spread(read_error_table())
    assert spread == pytest.approx(_independent_spread(), rel=1e-12) and spread > 0 and stacks >= 2


def test_simulate_row_names_the_unknown_stack_and_widens_its_likely_range() -> None:
    """Through the Python API: the StepResult of a JAX row says it ran on a fallback stack and its likely range
    is the known row's, widened on the ratio scale by the tables' spread across stacks, on both sides."""
    p, r = simulate_row(JAX)
    _, known = simulate_row(NEMO)
    assert r is not None and known is not None and p.run is not None
    assert r.step_time_s == known.step_time_s == simulate(p.run).step_time_s
    assert any("has no stack profile" in n for n in r.notes)
    assert not any("has no stack profile" in n for n in known.notes)
    assert r.error_band is not None and known.error_band is not None
    factor = math.exp(_independent_spread())
    assert r.error_band.high_s == pytest.approx(known.error_band.high_s * factor, rel=1e-12)
    assert r.error_band.low_s == pytest.approx(known.error_band.low_s / factor, rel=1e-12)


def test_validate_rows_carry_the_profile_flag_and_the_likely_range(tmp_path: Path) -> None:
    frame, _ = validate_runs(_write(tmp_path / "runs.csv", [NEMO, JAX]))
    nemo, jax = frame.iloc[0], frame.iloc[1]
    assert nemo["status"] == jax["status"] == "ok"
    assert bool(nemo["stack_profiled"]) and not bool(jax["stack_profiled"])
    assert jax["predicted_step_time_s"] == nemo["predicted_step_time_s"]
    assert jax["likely_low_s"] < nemo["likely_low_s"] < nemo["likely_high_s"] < jax["likely_high_s"]
    assert any("has no stack profile" in a for a in jax["assumptions"])


def test_validate_row_with_a_token_batch_is_predicted_not_an_error(tmp_path: Path) -> None:
    """A row quoting 90,000 tokens at 4,096 per sequence on dp 8 (21.97 sequences): before, 21 sequences and an
    error row (not divisible by dp); now U = 32,768 tokens, 2.75 -> 3 micro-batches per rank, 98,304 tokens."""
    row = {**{k: str(v) for k, v in SMALL_ROWS[0].items()}, "run_id": "tokens", "global_batch_seqs": "",
           "global_batch_tokens": "90000"}
    p = parse_row(row)
    assert p.status == "ok" and p.run is not None
    assert p.run.train.global_batch_tokens == 98_304
    assert any("rounded to the nearest such batch, 98,304 tokens" in a for a in p.assumptions)
    frame, _ = validate_runs(_write(tmp_path / "runs.csv", [row]))
    assert frame.loc[0, "status"] == "ok"
    assert any("98,304 tokens" in a for a in frame.loc[0, "assumptions"])
