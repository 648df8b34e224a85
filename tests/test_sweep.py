"""Sweeps (simtrain.studies.sweep): grid parsing, one row per point, errors as rows, files, workers vs Dask."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from simtrain.cli.main import main
from simtrain.spec.errors import ConfigError
from simtrain.studies.sweep import expand_grid, parse_grid, read_table, sweep, write_table

# Llama 3 8B with 4 layers on one node: every point simulates in a few milliseconds.
BASE: dict[str, Any] = {
    "name": "sweep-test", "model": {"preset": "llama3-8b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"tp": 1, "dp": 8},
    "train": {"seq_len": 1024, "global_batch_seqs": 32},
}
GRID = {"layout.tp": [1, 2, 4], "layout.pp": [1, 2], "layout.dp": ["auto"], "train.micro_batch_size": [1, 3]}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return sweep(BASE, GRID, workers=1)


def test_parse_grid() -> None:
    assert parse_grid(["layout.tp=1,2,4", "layout.recompute=none,full", "layout.sequence_parallel=true"]) == {
        "layout.tp": [1, 2, 4], "layout.recompute": ["none", "full"], "layout.sequence_parallel": [True]}
    with pytest.raises(ConfigError) as err:
        parse_grid(["layout.tp", "layout.pp=1", "layout.pp=2"])
    assert [p.path for p in err.value.problems] == ["--grid", "--grid"]


def test_expand_grid_order() -> None:
    pts = expand_grid({"a": [1, 2], "b": ["x", "y"]})
    assert pts == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]


def test_one_row_per_point_with_units(table: pd.DataFrame) -> None:
    assert len(table) == 12 and list(table["point"]) == list(range(12))
    assert list(table.columns[:5]) == ["point", "layout.tp", "layout.pp", "layout.dp", "train.micro_batch_size"]
    for col in ("step_time_s", "mfu", "bubble_s", "exposed_tp_s", "peak_memory_bytes", "capacity_bytes", "fits",
                "memory_json", "model.name", "hardware.n_nodes", "layout.zero_stage", "error"):
        assert col in table
    ok = table[table["error"].isna()]
    assert (ok["layout.dp"] * ok["layout.tp"] * ok["layout.pp"] == 8).all()  # dp=auto filled the node
    mem = json.loads(ok.iloc[0]["memory_json"])
    assert mem[0]["peak_bytes"] > 0 and 0 < len(mem[0]["timeline"]) <= 96
    # the likely measured range (simtrain.studies.uncertainty) brackets the same ratio of every point's step time
    assert (ok["step_time_low_s"] < ok["step_time_high_s"]).all()
    ratios = (ok["step_time_high_s"] / ok["step_time_s"]).round(12)
    assert ratios.nunique() == 1


def test_failing_points_become_rows(table: pd.DataFrame) -> None:
    """Micro-batch 3 does not divide 32 sequences over dp: those points carry the error, the rest ran."""
    bad = table[table["train.micro_batch_size"] == 3]
    good = table[table["train.micro_batch_size"] == 1]
    assert bad["error"].str.contains("micro_batch_size").all() and (bad["error_kind"] == "config").all()
    assert good["error"].isna().all() and (good["step_time_s"] > 0).all()


def test_workers_give_the_same_table(table: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(sweep(BASE, GRID, workers=2), table)


def test_dask_local_cluster_gives_the_same_table(table: pd.DataFrame) -> None:
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
                                  protocol="tcp") as cluster:
        got = sweep(BASE, GRID, scheduler=cluster.scheduler_address)
    pd.testing.assert_frame_equal(got, table)


def test_unreachable_scheduler_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        sweep(BASE, {"layout.tp": [1]}, scheduler="tcp://127.0.0.1:9", connect_timeout_s=0.5)
    assert err.value.problems[0].path == "--scheduler"


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_table_round_trip(table: pd.DataFrame, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"sweep{suffix}"
    write_table(table, path)
    back = read_table(path)
    assert len(back) == len(table) and list(back.columns) == list(table.columns)
    assert back["step_time_s"].fillna(0).tolist() == pytest.approx(table["step_time_s"].fillna(0).tolist())
    assert back["fits"].tolist() == [bool(v) is True and v is not None and v == v for v in table["fits"]]
    with pytest.raises(ConfigError):
        write_table(table, tmp_path / "sweep.xlsx")


def test_whole_run_columns() -> None:
    df = sweep({**BASE, "run": {"tokens": "100M", "price_per_gpu_hour": 2.0}}, {"train.global_batch_seqs": [16, 32]},
               workers=1)
    assert (df["time_to_train_s"] > 0).all()
    assert df["cost"].tolist() == pytest.approx((2.0 * df["gpu_hours"]).tolist())
    steps = [-(-100e6 // (s * 1024)) for s in (16, 32)]
    assert df["run_steps"].tolist() == steps
    assert df["time_to_train_s"].tolist() == pytest.approx((df["step_time_s"] * steps).tolist())


def test_cli_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "base.json"
    cfg.write_text(json.dumps(BASE))
    out = tmp_path / "s.parquet"
    assert main(["sweep", str(cfg), "--grid", "layout.tp=1,2", "--grid", "layout.dp=auto", "--out", str(out),
                 "--workers", "1"]) == 0
    assert "2 points, 0 failed" in capsys.readouterr().out
    assert len(read_table(out)) == 2
    assert main(["sweep", str(cfg), "--grid", "layout.tp"]) == 2
    assert "--grid" in capsys.readouterr().err


def test_unknown_grid_key_is_a_config_error_up_front(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A grid key that names no config field fails before anything is simulated, naming the key and the
    fields valid where it goes wrong (it used to be "2 points, 2 failed" with no reason)."""
    with pytest.raises(ConfigError) as err:
        sweep(BASE, {"layout.tpx": [1, 2], "model.preset": ["llama3-8b"], "train.seq_len.x": [1]}, workers=1)
    first, second = err.value.problems
    assert first.path == "--grid" and "'layout.tpx'" in first.message and "'tpx' is not a field of layout" in first.message
    assert "valid: dp, tp, pp, cp" in first.message
    assert "train.seq_len is a single value" in second.message
    cfg = tmp_path / "base.json"
    cfg.write_text(json.dumps(BASE))
    assert main(["sweep", str(cfg), "--grid", "layout.tpx=1,2"]) == 2
    out = capsys.readouterr()
    assert "layout.tpx" in out.err and "Traceback" not in out.err and out.out == ""


def test_cli_sweep_shows_why_points_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A point that fails for another reason stays a row with its reason, and the CLI prints it."""
    cfg = tmp_path / "base.json"
    cfg.write_text(json.dumps(BASE))
    assert main(["sweep", str(cfg), "--grid", "layout.tp=1,3", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 points, 1 failed" in out and "failed points (1):" in out
    assert "point 1 (layout.tp=3): invalid configuration" in out and "layout.tp: 3 does not divide model.n_heads=32" in out


def test_progress_bar_with_eta_on_stderr_only_when_wanted(capsys: pytest.CaptureFixture[str]) -> None:
    """The helper draws label, done/total and an ETA on stderr; disabled it draws nothing; the CLI wants
    it only on a terminal and never with --json."""
    import io

    from simtrain.studies.progress import progress_bar, wanted

    with progress_bar("simulating", 3, enabled=True) as advance:
        advance(2)
        advance(1)
    out = capsys.readouterr()
    assert out.out == "" and "simulating" in out.err and "3/3" in out.err and "ETA" in out.err
    with progress_bar("simulating", 3) as advance:
        advance(3)
    assert capsys.readouterr().err == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wanted(stream=Tty()) and not wanted(json_output=True, stream=Tty())
    assert not wanted(no_progress=True, stream=Tty()) and not wanted(stream=io.StringIO())
    sweep(BASE, {"layout.tp": [1, 2]}, workers=1, progress=True)
    assert "2/2" in capsys.readouterr().err
