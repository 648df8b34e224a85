"""GPipe and 1F1B: one model chunk per stage, every backward whole.

- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 sec. 2.2): ``p - s - 1`` warm-up forwards, then
  alternate one forward and one backward, then drain the backwards.
"""

from __future__ import annotations

from typing import ClassVar

from simtrain.plan.schedules.base import Action, Schedule
from simtrain.spec.schedule_names import ScheduleKind


def gpipe(p: int, m: int) -> list[list[Action]]:
    """GPipe: every stage runs F for all micro-batches, then B for all of them."""
    return [[Action("F", i, 0) for i in range(m)] + [Action("B", i, 0) for i in range(m)] for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """1F1B (PipeDream-Flush): warm-up forwards, steady one-forward-one-backward, drain."""
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts = [Action("F", i, 0) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            acts.append(Action("F", f, 0))
            acts.append(Action("B", b, 0))
            f, b = f + 1, b + 1
        acts += [Action("B", i, 0) for i in range(b, m)]
        out.append(acts)
    return out


class GPipe(Schedule):
    """GPipe: every micro-batch is in flight on every stage before the first backward."""

    kind: ClassVar[str] = ScheduleKind.GPIPE
    title: ClassVar[str] = "GPipe"
    uniform_bubble: ClassVar[bool] = True

    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        return gpipe(p, m)

    def in_flight(self, p: int, stage: int, m: int) -> int | None:
        return m

    def peak_microbatches(self, p: int, m: int) -> int:
        return m


class OneFOneB(Schedule):
    """1F1B: stage ``s`` holds at most ``p - s`` micro-batches, reached before the ``(p + 1)``-th."""

    kind: ClassVar[str] = ScheduleKind.ONE_F_ONE_B
    title: ClassVar[str] = "1F1B"
    uniform_bubble: ClassVar[bool] = True

    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        return one_f_one_b(p, m)

    def in_flight(self, p: int, stage: int, m: int) -> int | None:
        return min(p - stage, m)

    def peak_microbatches(self, p: int, m: int) -> int:
        return min(m, p + 1)

    def short_period(self, p: int) -> int:
        # past the warm-up every stage runs one forward and one backward per micro-batch in a fixed order
        # (Narayanan et al. 2021, Fig. 4 top), so each micro-batch repeats the last; the shortcut's
        # extrapolation checks that the engine agrees (steady.extrapolate)
        return 1
