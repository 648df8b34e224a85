"""The likely measured step time (simtrain.studies.uncertainty): percentiles, the choice of runs, files, CLI."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from simtrain.cli.main import main
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.spec.stacks import STACKS
from simtrain.studies.run import render_run, simulate_run
from simtrain.studies.simulate import cluster_of, simulate
from simtrain.studies.uncertainty import (
    ARCHIVE_TABLE,
    COLUMNS,
    MIN_RUNS,
    PACKAGED_TABLE,
    ErrorRow,
    Sample,
    band_for,
    leave_one_out,
    order_statistic_bounds,
    read_error_table,
    sample_shift,
    stack_family,
    transfer,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama3_8b_h100_fsdp.yaml"  # the smallest dense example: ~1 s to simulate


def _rows(errors: list[float], family: str = "megatron", moe: bool = False, gpu: str = "h100-sxm",
          sample: Sample = Sample.OUT) -> list[ErrorRow]:
    return [ErrorRow(f"r{i}", "test", gpu, family, moe, e, "", sample) for i, e in enumerate(errors)]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)
    return path


def test_band_is_an_order_statistic_prediction_interval() -> None:
    """Nine errors 0, 5, ..., 40 %: ranks j = floor(0.1 x 10) = 1, k = ceil(0.9 x 10) = 9, so the band is
    the whole range, coverage 8/10; a 10 s prediction is likely measured between 10 / 1.4 and 10 / 1.0 s."""
    b = band_for(10.0, "megatron-te", False, "h100-sxm", _rows([5.0 * i for i in range(9)]))
    assert b is not None
    assert (b.error_low_pct, b.error_median_pct, b.error_high_pct) == pytest.approx((0.0, 20.0, 40.0))
    assert b.low_s == pytest.approx(10.0 / 1.4) and b.high_s == pytest.approx(10.0)
    assert b.coverage == pytest.approx(0.8) and b.runs == 9 and "megatron stacks, dense, h100-sxm" in b.basis


@pytest.mark.parametrize("n, ranks, coverage", [(2, (1, 2), 1 / 3), (9, (1, 9), 0.8), (19, (2, 18), 0.8),
                                                 (60, (6, 55), 49 / 61)])
def test_order_statistic_ranks(n: int, ranks: tuple[int, int], coverage: float) -> None:
    j, k = order_statistic_bounds(n)
    assert (j, k) == ranks and (k - j) / (n + 1) == pytest.approx(coverage)


def test_a_model_that_predicts_too_fast_widens_the_band_upwards() -> None:
    b = band_for(2.0, "torchtitan-compile", False, "h100-sxm", _rows([-20.0, -15.0, -10.0, -5.0], "torchtitan"))
    assert b is not None and b.low_s > 2.0 and b.high_s > b.low_s


def test_runs_are_chosen_by_gpu_then_family_never_mixing_dense_and_moe() -> None:
    same_gpu = _rows([1.0] * 9)
    other_gpu = _rows([50.0, 60.0], gpu="a100-80gb")
    other_family = _rows([-30.0] * 3, family="torchtitan")
    moe = _rows([-60.0, -40.0, 10.0], moe=True)
    table = same_gpu + other_gpu + other_family + moe
    b = band_for(1.0, "megatron-core", False, "H100-SXM", table)
    assert b is not None and b.runs == 9 and b.error_high_pct == pytest.approx(1.0)  # enough on the same GPU
    b = band_for(1.0, "megatron-core", False, "b200", table)
    assert b is not None and b.runs == 11 and "any GPU" in b.basis  # the family on any GPU
    b = band_for(1.0, "composer-fsdp", False, "h100-sxm", table)
    assert b is not None and b.runs == 14 and "dense models" in b.basis  # no composer runs: every dense run
    b = band_for(1.0, "megatron-te", True, "h100-sxm", table)  # 3 MoE runs: their whole range, 50 % coverage
    assert b is not None and b.runs == 3 and "MoE models" in b.basis and b.coverage == pytest.approx(0.5)
    assert (b.error_low_pct, b.error_high_pct) == pytest.approx((-60.0, 10.0))


def test_too_few_runs_or_no_step_give_no_band() -> None:
    assert band_for(1.0, "megatron-te", True, "h100-sxm", _rows([1.0] * 9) + _rows([5.0], moe=True)) is None
    assert band_for(0.0, "megatron-te", False, "h100-sxm", _rows([1.0] * MIN_RUNS)) is None


def test_packaged_bands_cover_left_out_runs_as_promised() -> None:
    """Leave-one-out on the published runs: each run's band built from the others. The bands promise
    83 % on average (50 % for the MoE runs, of which only three others are known; 80-88 % for the rest)
    and hold 53 of 61 runs (87 %); the sample's 10th-90th percentiles instead held 46 (75 %). With the
    out-of-sample archive beside them (122 runs, 36 of them MoE): 103 held (84 %), 82 % promised (83 % before
    the in-sample published runs gave way to the out-of-sample ones where there are enough)."""
    loo = leave_one_out(read_error_table(PACKAGED_TABLE))
    assert loo["runs"] >= 55 and loo["held_pct"] >= 78.0 and loo["promised_pct"] >= 78.0
    both = leave_one_out(read_error_table())
    assert both["runs"] >= 120 and both["held_pct"] >= 78.0 and both["promised_pct"] >= 78.0


def test_default_table_is_the_published_then_the_archived_runs() -> None:
    """The default table reads both packaged files, published runs first, and no run twice."""
    rows = read_error_table()
    published, archived = read_error_table(PACKAGED_TABLE), read_error_table(ARCHIVE_TABLE)
    assert [r.run_id for r in rows] == [r.run_id for r in published + archived]
    assert len(archived) == 61 and {r.source for r in archived} == {"Megatron-Bridge 25.11", "Megatron-Bridge 26.02"}
    assert len({r.run_id for r in rows}) == len(rows)


def test_leave_one_out_counts_runs_inside_their_band() -> None:
    """Nine runs at 0 % and one at +50 %: each 0 % run's band (from the other nine) spans 0..50 %, so it
    holds; the +50 % run's band (nine zeros) is 0..0 and misses it: 9 of 10, promised 80 %."""
    loo = leave_one_out(_rows([0.0] * 9 + [50.0]))
    assert (loo["runs"], loo["held"]) == (10, 9) and loo["promised_pct"] == pytest.approx(80.0)
    assert leave_one_out(_rows([1.0]))["held_pct"] is None


def test_stack_family() -> None:
    assert stack_family("megatron-te") == stack_family("Megatron-Legacy") == "megatron"
    assert stack_family("torchtitan-compile-2024") == "torchtitan" and stack_family("deepspeed") == "deepspeed"


def test_packaged_table_covers_the_published_runs() -> None:
    rows = read_error_table()
    assert PACKAGED_TABLE.is_file() and len(rows) >= 55
    assert {r.family for r in rows} <= {stack_family(s) for s in STACKS}
    assert all(-100.0 < r.error_pct < 100.0 for r in rows) and any(r.moe for r in rows)
    assert len({r.run_id for r in rows}) == len(rows)


def test_read_error_table_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.csv"):
        read_error_table(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("run_id,error\nx,1\n")
    with pytest.raises(ConfigError, match="columns run_id, source"):
        read_error_table(bad)
    row = dict(run_id="x", source="s", gpu_type="h100-sxm", stack="megatron-te", moe="False")
    with pytest.raises(ConfigError, match=r"line 2\.step_time_error_pct.*'fast'"):
        read_error_table(_write(tmp_path / "text.csv", [{**row, "step_time_error_pct": "fast"}]))
    with pytest.raises(ConfigError, match="above -100"):
        read_error_table(_write(tmp_path / "low.csv", [{**row, "step_time_error_pct": "-100"}]))


def test_simulate_attaches_a_band_around_its_step_time() -> None:
    r = simulate(EXAMPLE)
    b = r.error_band
    assert b is not None and b.low_s < b.high_s and b.runs >= MIN_RUNS
    assert b.low_s <= r.step_time_s * 1.5 and b.high_s >= r.step_time_s / 1.5
    assert "megatron stacks, dense" in b.basis
    assert simulate(EXAMPLE).error_band == b  # deterministic
    assert r.to_dict()["error_band"] == b.to_dict()


def test_cli_simulate_reads_a_users_error_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    row = dict(source="my cluster", gpu_type="h100-sxm", stack="megatron-te", moe="False")
    table = _write(tmp_path / "mine.csv", [{**row, "run_id": f"m{i}", "step_time_error_pct": e}
                                           for i, e in enumerate([-10, -5, 0, 5, 10])])
    assert main(["simulate", str(EXAMPLE), "--json", "--error-table", str(table)]) == 0
    band = json.loads(capsys.readouterr().out)["error_band"]
    assert band["runs"] == 5 and band["error_low_pct"] == pytest.approx(-10.0) and band["coverage"] == pytest.approx(4 / 6)
    # the range says how far to trust a prediction; it never moves it
    assert simulate(EXAMPLE, error_table=table).step_time_s == simulate(EXAMPLE).step_time_s
    assert main(["simulate", str(EXAMPLE), "--error-table", str(table)]) == 0
    assert "likely range" in capsys.readouterr().out
    assert main(["simulate", str(EXAMPLE), "--error-table", str(tmp_path / "nope.csv")]) == 2
    assert "error_table" in capsys.readouterr().err


def test_whole_run_range_is_steps_times_each_phases_band() -> None:
    """Every phase shares the stack, GPU and model, so the range is the time to train times one band's
    ratios; the run summary prints it."""
    path = ROOT / "examples" / "llama1_65b_a100_run.yaml"
    r = simulate_run(path)
    run = load_config(path)
    unit = band_for(1.0, run.train.stack, run.model.is_moe, cluster_of(run).gpu.name, read_error_table())
    assert unit is not None and r.time_to_train_range_s is not None and r.range_basis == unit.basis
    assert r.time_to_train_range_s == pytest.approx((r.time_to_train_s * unit.low_s, r.time_to_train_s * unit.high_s),
                                                    rel=1e-9)
    assert "likely range" in render_run(r)


def test_out_of_sample_runs_replace_in_sample_ones_where_there_are_enough() -> None:
    """Nine out-of-sample runs at 0, 5, ..., 40 % beside five in-sample ones at 0 %: the band is the nine's
    (whole range, 80 %), as if the in-sample runs were not there; the in-sample ones do not narrow it."""
    table = _rows([5.0 * i for i in range(9)]) + _rows([0.0] * 5, sample=Sample.IN)
    b = band_for(10.0, "megatron-te", False, "h100-sxm", table)
    assert b is not None and b.runs == 9 and "out-of-sample runs only" in b.basis and "in sample" not in b.basis
    assert (b.error_low_pct, b.error_high_pct, b.coverage) == pytest.approx((0.0, 40.0, 0.8))


def test_in_sample_runs_widen_the_band_by_the_measured_shift() -> None:
    """Six in-sample runs at 0 %, three out-of-sample ones at -10 % (too few to stand alone): the nine give
    [-10 %, 0 %]; the shift from in-sample to out-of-sample is ln 0.9, so each bound moves out by x1/0.9:
    [0.9 x 0.9 - 1, 1 / 0.9 - 1] = [-19 %, +11.1 %], coverage still 8/10 (a lower bound)."""
    table = _rows([0.0] * 6, sample=Sample.IN) + _rows([-10.0] * 3)
    assert sample_shift(table, False) == pytest.approx(math.log(0.9)) and sample_shift(table, True) is None
    b = band_for(10.0, "megatron-te", False, "h100-sxm", table)
    assert b is not None and b.runs == 9 and b.coverage == pytest.approx(0.8)
    assert (b.error_low_pct, b.error_high_pct) == pytest.approx((-19.0, 100.0 / 9.0))
    assert (b.low_s, b.high_s) == pytest.approx((10.0 * 0.9, 10.0 / 0.81))
    assert "6 in sample" in b.basis and "widened x1.111" in b.basis
    # the same errors, every run out of sample (today's rule for a table of one origin): no widening
    plain = band_for(10.0, "megatron-te", False, "h100-sxm", _rows([0.0] * 6 + [-10.0] * 3))
    assert plain is not None and (plain.error_low_pct, plain.error_high_pct) == pytest.approx((-10.0, 0.0))


def test_in_sample_runs_alone_are_named_not_widened() -> None:
    """With no out-of-sample run of the kind there is no shift to measure: the band is the runs' own and its
    basis says they are in sample; two out-of-sample runs are still too few to measure it by."""
    for extra in ([], _rows([-30.0] * 2, gpu="b200")):
        b = band_for(1.0, "megatron-te", False, "h100-sxm", _rows([5.0 * i for i in range(9)], sample=Sample.IN) + extra)
        assert b is not None and (b.error_low_pct, b.error_high_pct) == pytest.approx((0.0, 40.0))
        assert "9 in sample" in b.basis and "no out-of-sample runs" in b.basis


def test_rows_know_whether_simtrain_was_shaped_on_them(tmp_path: Path) -> None:
    """The packaged published runs are in sample, the archive and a user's own table out of sample unless the
    caller or a ``sample`` cell says otherwise; a bad cell is a ConfigError naming the line and the values."""
    assert {r.sample for r in read_error_table(PACKAGED_TABLE)} == {Sample.IN}
    assert {r.sample for r in read_error_table(ARCHIVE_TABLE)} == {Sample.OUT}
    assert [r.sample for r in read_error_table()] == [Sample.IN] * 61 + [Sample.OUT] * 61
    row = dict(source="s", gpu_type="h100-sxm", stack="megatron-te", moe="False", step_time_error_pct="1")
    mine = _write(tmp_path / "mine.csv", [{**row, "run_id": "a"}])
    assert read_error_table(mine)[0].sample is Sample.OUT
    assert read_error_table(mine, Sample.IN)[0].sample is Sample.IN
    with (tmp_path / "tagged.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=[*COLUMNS, "sample"])
        w.writeheader()
        w.writerows([{**row, "run_id": "a", "sample": "in-sample"}, {**row, "run_id": "b", "sample": ""},
                     {**row, "run_id": "c", "sample": " Out-of-Sample "}])
    assert [r.sample for r in read_error_table(tmp_path / "tagged.csv", Sample.IN)] == [Sample.IN, Sample.IN, Sample.OUT]
    with (tmp_path / "bad.csv").open("w", newline="", encoding="utf-8") as fh:
        fh.write(",".join([*COLUMNS, "sample"]) + "\nx,s,h100-sxm,megatron-te,False,1,seen\n")
    with pytest.raises(ConfigError, match=r"line 2\.sample.*'seen'.*in-sample, out-of-sample or blank"):
        read_error_table(tmp_path / "bad.csv")


def test_packaged_bands_keep_their_promise_across_the_two_tables() -> None:
    """Bands built without a set, checked on it, in aggregate (the promise is the bands' mean coverage;
    tolerance 5 points, issue 29's): the published runs' bands on the archive held 50 of 61 (82 %, 72 %
    promised: the published table has only four MoE runs), the archive's on the published runs 52 of 61
    (85 %, 80 %); leaving out one source at a time (its runs correlated: a recipe's scaling points) 113 of
    122 (93 %, 83 % promised), against 107 with every run taken alike; one run at a time, 105 of 122 (86 %,
    82 % promised)."""
    published, archived = read_error_table(PACKAGED_TABLE), read_error_table(ARCHIVE_TABLE)
    alike = [replace(r, sample=Sample.OUT) for r in published + archived]
    checks = [transfer(published, archived), transfer(archived, published), leave_one_out(published + archived),
              _source_out(published + archived)]
    assert [c["runs"] for c in checks] == [61, 61, 122, 122]
    for c in checks:
        assert c["held_pct"] >= c["promised_pct"] - 5.0
    assert checks[3]["held"] >= _source_out(alike)["held"] + 5


def _source_out(rows: list[ErrorRow]) -> dict[str, float]:
    """Each source's runs checked against the bands of the other sources' runs, summed (``transfer``'s keys)."""
    parts = [transfer([r for r in rows if r.source != s], [r for r in rows if r.source == s])
             for s in sorted({r.source for r in rows})]
    runs, held = sum(d["runs"] for d in parts), sum(d["held"] for d in parts)
    return {"runs": runs, "held": held, "held_pct": 100.0 * held / runs,
            "promised_pct": sum(d["promised_pct"] * d["runs"] for d in parts) / runs}


def test_cli_user_table_says_which_runs_are_in_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's table whose ``sample`` column marks six runs at 0 % in sample beside three out-of-sample ones
    at -10 %: through the CLI and the Python API the band is widened x1/0.9 either way to [-19 %, +11.1 %]."""
    row = dict(source="my cluster", gpu_type="h100-sxm", stack="megatron-te", moe="False")
    rows = [{**row, "run_id": f"m{i}", "step_time_error_pct": 0.0 if i < 6 else -10.0,
             "sample": "in-sample" if i < 6 else ""} for i in range(9)]
    with (tmp_path / "mine.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=[*COLUMNS, "sample"])
        w.writeheader()
        w.writerows(rows)
    assert main(["simulate", str(EXAMPLE), "--json", "--error-table", str(tmp_path / "mine.csv")]) == 0
    band = json.loads(capsys.readouterr().out)["error_band"]
    assert (band["error_low_pct"], band["error_high_pct"]) == pytest.approx((-19.0, 100.0 / 9.0))
    assert band["runs"] == 9 and "6 in sample: widened x1.111" in band["basis"]
    r = simulate(EXAMPLE, error_table=tmp_path / "mine.csv")
    assert r.error_band is not None and r.error_band.to_dict() == pytest.approx(band)
    assert (r.error_band.low_s, r.error_band.high_s) == pytest.approx((0.9 * r.step_time_s, r.step_time_s / 0.81))
