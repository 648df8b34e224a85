"""Progress of a calibration: a rich progress bar with an ETA on stderr, one task per phase.

Shown only when stderr is a terminal and ``--json`` is not given (rich's own convention: a console
that is not a terminal gets no live display; CI logs and pipes keep the plain log lines instead), so
scripts and ``--json`` consumers see nothing of it. The ETA is rich's ``TimeRemainingColumn``: the
remaining count over the recent completion rate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Phase:
    """One phase's task: ``advance`` after each measurement, or ``update`` with the count done so far."""

    def __init__(self, bar: Progress | None, task: Any):
        self._bar, self._task = bar, task

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def update(self, completed: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed)


class CalibrationProgress:
    """The progress display of one calibration (inactive: every call is a no-op)."""

    def __init__(self, enabled: bool, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.active = enabled and self.console.is_terminal
        self._bar: Progress | None = None

    @classmethod
    def for_cli(cls, json_output: bool) -> CalibrationProgress:
        """Active when stderr is a terminal and the output is not ``--json``."""
        return cls(not json_output)

    @contextmanager
    def running(self) -> Iterator[CalibrationProgress]:
        """Show the display for the duration of the block (plain prints appear above it)."""
        if not self.active:
            yield self
            return
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console)
        with self._bar:
            yield self
        self._bar = None

    def phase(self, description: str, total: int) -> Phase:
        """A new task of ``total`` steps (a no-op task when inactive)."""
        if self._bar is None:
            return Phase(None, None)
        return Phase(self._bar, self._bar.add_task(description, total=total))
