"""``simtrain report`` on tables with non-numeric or infinite cells (fuzz cases 729, 977, 1578 of seed 1):
exit 2 naming the file, the column, the row and what is valid; never a ValueError/OverflowError traceback."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simtrain.cli.main import main
from simtrain.spec.errors import ConfigError
from simtrain.studies.report import check_table, render_markdown


@pytest.mark.parametrize(("text", "column", "row", "value"), [
    ("mfu,n_gpus,step_time_s\n0.5,8,1.0\n0.4,true,2.0\n", "n_gpus", 2, "'true'"),      # case 729's ValueError
    ("mfu,n_gpus,step_time_s\n0.5,1e400,1.0\n", "n_gpus", 1, "inf"),                 # OverflowError in round()
    ("mfu,step_time_s\n0.5,inf\n", "step_time_s", 1, "inf"),
    ("mfu,peak_memory_bytes,step_time_s\n0.5,{},1.0\n", "peak_memory_bytes", 1, "'{}'"),
    ("mfu,step_time_s,compute_s\n0.5,1.0,x\n", "compute_s", 1, "'x'"),
])
@pytest.mark.parametrize("out", [[], ["--md", "out.md"], ["--html", "out.html"]])
def test_report_refuses_bad_number_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, column: str,
                                         row: int, value: str, out: list[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    assert main(["report", str(path), *[str(tmp_path / o) if o.startswith("out") else o for o in out]]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}: column {column!r}, row {row}: {value} is not a finite number" in err
    assert "must be a number (or empty)" in err
    assert not list(tmp_path.glob("out.*"))


def test_empty_and_nan_cells_are_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Empty cells (a layout not simulated) and NaN stay allowed: the report leaves them blank."""
    path = tmp_path / "t.csv"
    path.write_text("mfu,n_gpus,step_time_s,error\n0.5,8,1.0,\n,,,oom\n0.25,,nan,\n")
    assert main(["report", str(path)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_check_table_lists_every_bad_cell_up_to_ten() -> None:
    df = pd.DataFrame({"mfu": ["x"] * 30, "step_time_s": [1.0] * 30})
    with pytest.raises(ConfigError) as info:
        check_table(df, "t.csv")
    assert len(info.value.problems) == 10
    assert [p.path for p in info.value.problems[:2]] == ["t.csv: column 'mfu', row 1", "t.csv: column 'mfu', row 2"]


def test_a_clean_table_still_reports() -> None:
    df = pd.DataFrame({"mfu": [0.5, 0.25], "n_gpus": [8, 16], "step_time_s": [1.0, 2.0]})
    check_table(df, "t")
    text = render_markdown(df, "r", "t")
    assert "50.0" in text.split("Best layouts")[1]
