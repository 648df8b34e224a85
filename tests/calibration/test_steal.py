"""The hypervisor-steal meter (calibration.steal) and the re-measurement it drives (measure_steady)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calibration.steal import cpu_ticks, steal_fraction


def _compare() -> Any:
    """``calibration.compare`` (it imports torch: skipped without the calibration extra; the steal meter is
    plain Python and runs without it)."""
    return pytest.importorskip("calibration.compare")


def _stat(tmp_path: Path, line: str) -> Path:
    p = tmp_path / "stat"
    p.write_text(line + "\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    return p


def test_ticks_read_steal_column_and_total_without_guest(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (proc(5))
    p = _stat(tmp_path, "cpu  100 5 20 800 10 0 5 60 40 0")
    assert cpu_ticks(p) == (60, 100 + 5 + 20 + 800 + 10 + 0 + 5 + 60)


def test_unreadable_or_foreign_stat_gives_none(tmp_path: Path) -> None:
    assert cpu_ticks(tmp_path / "missing") is None
    assert cpu_ticks(_stat(tmp_path, "intr 1 2 3")) is None


def test_steal_fraction() -> None:
    assert steal_fraction((10, 1000), (30, 1200)) == pytest.approx(0.1)
    assert steal_fraction(None, (30, 1200)) == 0.0
    assert steal_fraction((10, 1000), (10, 1000)) == 0.0  # no time passed


def test_this_machine_reads_a_fraction_in_0_1() -> None:
    f = steal_fraction(cpu_ticks(), cpu_ticks())
    assert 0.0 <= f <= 1.0


def test_measure_steady_remeasures_a_stolen_batch_and_keeps_the_cleanest(monkeypatch: pytest.MonkeyPatch) -> None:
    compare = _compare()
    steals = iter([0.30, 0.10, 0.05])
    calls: list[int] = []

    def fake(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        s = next(steals)
        return {"step_times_s": [s], "steal_fraction": s}

    monkeypatch.setattr(compare, "measure", fake)
    got = compare.measure_steady("cfg", 2, 6, 2, 1, Path("."), tries=3, max_steal=0.02)
    assert len(calls) == 3 and got["steal_fraction"] == 0.05


def test_measure_steady_stops_at_a_clean_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    compare = _compare()
    steals = iter([0.0, 0.5])
    monkeypatch.setattr(compare, "measure", lambda *a, **k: {"steal_fraction": next(steals)})
    assert compare.measure_steady("cfg", 1, 6, 2, 1, Path("."))["steal_fraction"] == 0.0
