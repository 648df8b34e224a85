"""The names ``layout.schedule`` accepts: what a config may say, not what a schedule does.

The schedule objects (action lists, routes, constraints) are the plan's (``simtrain.plan.schedules``);
a config is checked field by field before any of them is needed, so the names live here, one stage
earlier in the dataflow. ``SCHEDULE_NAMES`` starts with the built-in ones (:class:`ScheduleKind`);
``simtrain.plan.schedules.REGISTRY`` adds the name of every schedule registered later and removes it
when it is unregistered, so a new schedule is still written in one file.

This module imports nothing from simtrain.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

__all__ = ["SCHEDULE_NAMES", "ScheduleKind", "ScheduleNames"]


class ScheduleKind(StrEnum):
    """Names of the built-in schedules, as configs and JSON write them (``layout.schedule``)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"
    ZB_H1 = "zb_h1"
    DUALPIPE = "dualpipe"
    DUALPIPEV = "dualpipev"


class ScheduleNames:
    """Schedule names a config may give, in registration order (besides ``auto``, the config's default)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._names: list[str] = [str(n) for n in names]

    def add(self, name: str) -> None:
        """Accept ``name`` (kept once)."""
        if str(name) not in self._names:
            self._names.append(str(name))

    def discard(self, name: str) -> None:
        """Stop accepting ``name`` (nothing if it is not accepted)."""
        if str(name) in self._names:
            self._names.remove(str(name))

    def names(self) -> tuple[str, ...]:
        """The accepted names, in registration order."""
        return tuple(self._names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._names


SCHEDULE_NAMES = ScheduleNames(ScheduleKind)
"""The names ``layout.schedule`` accepts: the built-in schedules and those ``simtrain.plan.schedules.REGISTRY``
registers later."""
