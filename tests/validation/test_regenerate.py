"""The packaged error tables are rebuilt by one command, ``python -m simtrain.validation.regenerate`` (issue 29
part 6): here on small CSVs, into a temporary folder (the packaged files are not touched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simtrain.studies.uncertainty import error_table
from simtrain.validation import regenerate
from simtrain.validation.fidelity import validate_runs

from .conftest import SMALL_ROWS, write_csv


@pytest.fixture
def outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    pub, arch = tmp_path / "out" / "published_errors.csv", tmp_path / "out" / "megatron_bridge_errors.csv"
    monkeypatch.setattr(regenerate, "PACKAGED_TABLE", pub)
    monkeypatch.setattr(regenerate, "ARCHIVE_TABLE", arch)
    return pub, arch


def test_one_command_writes_both_tables_then_checks_them(tmp_path: Path, outputs: tuple[Path, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a = write_csv(tmp_path / "a.csv", SMALL_ROWS[:2])
    b = write_csv(tmp_path / "b.csv", SMALL_ROWS[2:3])
    args = ["--published", str(a), "--archive", str(b), "--workers", "1"]
    assert regenerate.main(args) == 0
    pub, arch = outputs
    assert pub.read_text() == error_table(validate_runs(a)[0]).to_csv(index=False)
    assert arch.read_text() == error_table(validate_runs(b)[0]).to_csv(index=False)
    assert len(pub.read_text().splitlines()) == 3  # the header and the two visible, simulated rows
    assert not list(pub.parent.glob(".*.tmp"))  # written atomically: no temporary file left
    capsys.readouterr()
    assert regenerate.main([*args, "--check"]) == 0
    assert "both error tables are today's" in capsys.readouterr().out
    pub.write_text(pub.read_text().replace("tiny-fsdp", "edited"))
    edited = pub.read_text()
    assert regenerate.main([*args, "--check"]) == 1  # not today's: said, and nothing written
    assert f"differs: {pub}" in capsys.readouterr().out and pub.read_text() == edited
    assert regenerate.main(args) == 0 and "edited" not in pub.read_text()


def test_a_missing_input_writes_nothing(tmp_path: Path, outputs: tuple[Path, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    a = write_csv(tmp_path / "a.csv", SMALL_ROWS[:1])
    assert regenerate.main(["--published", str(a), "--archive", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert "runs_csv" in err and "nope.csv" in err and "--archive" in err
    assert not outputs[0].exists() and not outputs[1].exists()
