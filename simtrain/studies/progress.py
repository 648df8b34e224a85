"""Progress bars with an ETA for the long commands (validate, run, search, sweep), on stderr.

Library functions stay silent: they take ``progress: bool = False`` and open their bar with
``progress_bar(label, total, enabled=progress)``, which yields an ``advance(n)`` callback (a no-op when
disabled). The CLI turns bars on with ``wanted(...)``: never under ``--json`` or ``--no-progress``, and
only when stderr is a terminal, so logs and pipes get no control characters.

A bar shows the label, the bar, done/total, elapsed time and rich's estimate of the time left (its
moving average of the recent completion rate).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO, TypeVar

T = TypeVar("T")

Advance = Callable[[int], None]
"""Callback that marks ``n`` more units of work done."""


def wanted(json_output: bool = False, no_progress: bool = False, stream: TextIO | None = None) -> bool:
    """Whether a command should show progress: not with ``--json`` or ``--no-progress``, and only
    when ``stream`` (default stderr) is a terminal."""
    out = sys.stderr if stream is None else stream
    return not json_output and not no_progress and out.isatty()


def ticking(items: Iterable[T], advance: Advance) -> Iterator[T]:
    """The items, calling ``advance(1)`` after the loop body has done with each."""
    for item in items:
        yield item
        advance(1)


def _ignore(n: int) -> None:
    """The advance callback of a disabled bar."""


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = False) -> Iterator[Advance]:
    """A rich progress bar of ``total`` units on stderr (label, bar, M/N, elapsed, time left).

    Yields ``advance(n)``; when ``enabled`` is False nothing is drawn (and rich is not imported).
    """
    if not enabled:
        yield _ignore
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)

        yield advance
