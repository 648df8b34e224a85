"""Pipeline schedules as data and as objects, and a schedule-level timing evaluator.

- :mod:`simtrain.plan.schedules.base`: :class:`Action` (the action kinds and the memory rule),
  :class:`Route`, the :class:`Schedule` interface, :class:`ScheduleKind` and :class:`ScheduleRegistry`.
- One module per schedule family: :mod:`~simtrain.plan.schedules.gpipe_1f1b` (GPipe, 1F1B),
  :mod:`~simtrain.plan.schedules.interleaved` (interleaved 1F1B), :mod:`~simtrain.plan.schedules.zero_bubble`
  (ZB-H1), :mod:`~simtrain.plan.schedules.dualpipe` (DualPipe, DualPipeV).
- :mod:`~simtrain.plan.schedules.check` (:func:`validate_schedule`) and :mod:`~simtrain.plan.schedules.timing`
  (:func:`makespan`).

``REGISTRY`` holds the built-in schedules under their config names (``layout.schedule``);
:func:`schedule_of` looks one up and raises :class:`UnknownSchedule` (a ValueError) for any other
name, so no caller falls back to 1F1B. To add a schedule, write its module (a :class:`Schedule`
subclass) and register an instance here, or at run time with ``REGISTRY.register`` /
``REGISTRY.registered`` (the config then accepts its name).
"""

from __future__ import annotations

from simtrain.plan.schedules.base import (
    Action,
    Route,
    RouteShape,
    Schedule,
    ScheduleError,
    ScheduleRegistry,
    UnknownSchedule,
    max_in_flight,
    max_pending_weight_grads,
    split_backward_keys,
    splits_backward,
)
from simtrain.plan.schedules.check import validate_schedule
from simtrain.plan.schedules.dualpipe import DualPipe, DualPipeV, dualpipe, dualpipev
from simtrain.plan.schedules.gpipe_1f1b import GPipe, OneFOneB, gpipe, one_f_one_b
from simtrain.plan.schedules.interleaved import (
    PEAK_MICROBATCHES_PER_STAGE,
    Interleaved1F1B,
    interleaved_1f1b,
    interleaved_group_size,
)
from simtrain.plan.schedules.timing import UNIT_COSTS, ActionCosts, CostFn, ScheduleTiming, makespan
from simtrain.plan.schedules.zero_bubble import ZBH1, zb_h1
from simtrain.spec.schedule_names import SCHEDULE_NAMES, ScheduleKind

__all__ = [
    "PEAK_MICROBATCHES_PER_STAGE", "REGISTRY", "SCHEDULES", "UNIT_COSTS", "ZBH1", "Action", "ActionCosts", "CostFn",
    "DualPipe", "DualPipeV", "GPipe", "Interleaved1F1B", "OneFOneB", "Route", "RouteShape", "Schedule",
    "ScheduleError", "ScheduleKind", "ScheduleRegistry", "ScheduleTiming", "UnknownSchedule", "build_schedule",
    "dualpipe", "dualpipev", "gpipe", "interleaved_1f1b", "interleaved_group_size", "makespan", "max_in_flight",
    "max_pending_weight_grads", "one_f_one_b", "schedule_of", "schedule_route", "split_backward_keys",
    "splits_backward", "validate_schedule", "zb_h1",
]  # fmt: skip

REGISTRY = ScheduleRegistry([GPipe(), OneFOneB(), Interleaved1F1B(), ZBH1(), DualPipe(), DualPipeV()], SCHEDULE_NAMES)
"""The schedules a config may name (``layout.schedule``), built-in ones in :class:`ScheduleKind` order."""

SCHEDULES: tuple[str, ...] = tuple(ScheduleKind)
"""Names of the built-in schedules (:func:`build_schedule` accepts these and any registered later)."""


def schedule_of(kind: str) -> Schedule:
    """The registered schedule of that name; :class:`UnknownSchedule` (a ValueError) for any other."""
    return REGISTRY.get(kind)


def build_schedule(kind: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per-stage action lists of the named schedule (see :meth:`Schedule.actions`)."""
    return schedule_of(kind).actions(p, m, v)


def schedule_route(kind: str, p: int, m: int, v: int = 1) -> Route:
    """The :class:`Route` of a schedule built by :func:`build_schedule` with the same arguments."""
    return schedule_of(kind).route(p, m, v)
