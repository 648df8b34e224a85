"""A schedule-level timing evaluator: :func:`makespan` executes a schedule at the level of whole actions.

No simpy: each stage runs its list in order, an action starts when its stage is free and its
cross-stage inputs have arrived, and the result holds each action's start and end, each stage's busy
and idle (bubble) time. A schedule whose stages wait on each other in a cycle raises
:class:`ScheduleError`. :func:`compile_schedule` resolves a schedule once so that timing it with other
costs is a single pass (layout search times every layout's pipeline this way, ``simtrain.engine.probe``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from simtrain.plan.schedules.base import Action, Route, ScheduleError, split_backward_keys
from simtrain.plan.schedules.check import action_name, default_route, validate_schedule


class ActionCosts(NamedTuple):
    """Durations of the actions on one (stage, chunk), in seconds (or any one unit).

    ``b_s`` is the input-gradient backward and ``w_s`` the weight-gradient pass, so a full backward
    lasts ``b_s + w_s``. ``fb_s`` is an overlapped F&B pair (DeepSeek-V3's "F&B"); None means no
    overlap gain (the F plus its partner backward). ``p2p_s`` is added to every input that comes
    from another stage.
    """

    f_s: float = 1.0
    b_s: float = 1.0
    w_s: float = 1.0
    fb_s: float | None = None
    p2p_s: float = 0.0


CostFn = Callable[[int, int], ActionCosts]
"""Per-(stage, chunk) costs, e.g. for uneven stages."""


@dataclass(frozen=True, slots=True)
class ScheduleTiming:
    """What :func:`makespan` returns; times in the unit of the costs, from the step start at 0."""

    start_s: tuple[tuple[float, ...], ...]
    """Per stage, per action (same indices as the schedule): start time."""
    end_s: tuple[tuple[float, ...], ...]
    stage_end_s: tuple[float, ...]
    """When each stage finishes its last action."""
    busy_s: tuple[float, ...]
    """Time each stage spends computing (an overlapped pair counts once, for its F&B duration)."""
    makespan_s: float

    @property
    def bubble_s(self) -> tuple[float, ...]:
        """Idle time of each stage within the step: ``makespan - busy``."""
        return tuple(self.makespan_s - b for b in self.busy_s)

    @property
    def max_bubble_s(self) -> float:
        return max(self.bubble_s)


UNIT_COSTS = ActionCosts()
"""F = B = W = 1, no overlap gain, no p2p latency: Qi et al. 2023's unit setting."""


def makespan(schedule: Sequence[Sequence[Action]], cost: ActionCosts | CostFn = UNIT_COSTS,
             route: Route | None = None) -> ScheduleTiming:
    """Execute a schedule at the level of whole actions and time it (see :class:`ScheduleTiming`).

    Each stage runs its list in order, one action (or overlapped F&B pair) at a time, as soon as
    the stage is free and the action's inputs are there: the F of a micro-batch needs its F on the
    previous (stage, chunk) of its ``route`` path, the B needs the B on the next one (the last
    model stage's B needs only its own F), a W follows its own B; an input from another stage
    arrives ``p2p_s`` after it was produced. The schedule is validated first; a schedule whose
    stages wait on each other in a cycle raises :class:`ScheduleError` naming the stuck actions.
    """
    route = route or default_route(schedule)
    validate_schedule(schedule, route)
    cost_of: CostFn = cost if callable(cost) else (lambda stage, chunk: cost)
    run = _Run(schedule, cost_of, route)
    run.execute()
    return run.timing()


class _Run:
    """State of one :func:`makespan` evaluation (local to the call)."""

    def __init__(self, schedule: Sequence[Sequence[Action]], cost_of: CostFn, route: Route) -> None:
        self.schedule, self.cost_of, self.route = schedule, cost_of, route
        self.p = len(schedule)
        self.units = [_units(acts) for acts in schedule]
        self.splits = [split_backward_keys(acts) for acts in schedule]
        self.next_unit = [0] * self.p
        self.free_at = [0.0] * self.p
        self.busy = [0.0] * self.p
        self.start = [[0.0] * len(acts) for acts in schedule]
        self.end = [[0.0] * len(acts) for acts in schedule]
        self.done: dict[tuple[str, int, int, int], tuple[float, int]] = {}
        self.waiting: dict[tuple[str, int, int, int], list[int]] = {}
        self.stuck: dict[int, tuple[Action, tuple[str, int, int, int]]] = {}
        self.order: list[tuple[int, int]] = []
        """(stage, unit) in the order they ran."""

    def execute(self) -> None:
        ready = list(range(self.p))
        while ready:
            ready += self._advance(ready.pop())
        if any(self.next_unit[s] < len(self.units[s]) for s in range(self.p)):
            raise ScheduleError("schedule deadlocks: " + "; ".join(
                f"stage {s} waits at {action_name(a)} for {k[0]}(mb={k[1]}, chunk={k[3]}) on stage {k[2]}"
                for s, (a, k) in sorted(self.stuck.items())))

    def _advance(self, s: int) -> list[int]:
        """Run stage ``s`` as far as its inputs allow; return the stages its results wake."""
        woken: list[int] = []
        while self.next_unit[s] < len(self.units[s]):
            idx = self.units[s][self.next_unit[s]]
            t = self.free_at[s]
            for n in idx:
                for key in self._inputs(s, self.schedule[s][n]):
                    if key not in self.done:
                        self.stuck[s] = (self.schedule[s][n], key)
                        self.waiting.setdefault(key, []).append(s)
                        return woken
                    t_done, src = self.done[key]
                    t = max(t, t_done + (self.cost_of(s, self.schedule[s][n].chunk).p2p_s if src != s else 0.0))
            dur = self._duration(s, [self.schedule[s][n] for n in idx])
            self.stuck.pop(s, None)
            self.free_at[s] = t + dur
            self.busy[s] += dur
            for n in idx:
                a = self.schedule[s][n]
                self.start[s][n], self.end[s][n] = t, t + dur
                key = (a.kind, a.microbatch, s, a.chunk)
                self.done[key] = (t + dur, s)
                woken += self.waiting.pop(key, [])
            self.order.append((s, self.next_unit[s]))
            self.next_unit[s] += 1
        return woken

    def _inputs(self, s: int, a: Action) -> list[tuple[str, int, int, int]]:
        """Keys ``(kind, mb, stage, chunk)`` of the actions ``a`` waits for."""
        if a.kind == "W":
            return [("B", a.microbatch, s, a.chunk)]
        k = self.route.position(a.microbatch, s, a.chunk)
        if a.kind == "F":
            if k == 0:
                return []
            st, c = self.route.at(a.microbatch, k - 1)
            return [("F", a.microbatch, st, c)]
        if k == self.route.length - 1:
            return [("F", a.microbatch, s, a.chunk)]
        st, c = self.route.at(a.microbatch, k + 1)
        return [("B", a.microbatch, st, c)]

    def _duration(self, s: int, unit: list[Action]) -> float:
        if len(unit) == 2:
            f, b = unit
            fb = self.cost_of(s, f.chunk).fb_s
            return fb if fb is not None else self._single(s, f) + self._single(s, b)
        return self._single(s, unit[0])

    def _single(self, s: int, a: Action) -> float:
        c = self.cost_of(s, a.chunk)
        if a.kind == "F":
            return c.f_s
        if a.kind == "W":
            return c.w_s
        return c.b_s if (a.microbatch, a.chunk) in self.splits[s] else c.b_s + c.w_s

    def timing(self) -> ScheduleTiming:
        ends = tuple(max(e, default=0.0) for e in self.end)
        return ScheduleTiming(start_s=tuple(map(tuple, self.start)), end_s=tuple(map(tuple, self.end)),
                              stage_end_s=ends, busy_s=tuple(self.busy), makespan_s=max(ends, default=0.0))


def _units(acts: Sequence[Action]) -> list[list[int]]:
    """Group a stage's action indices into execution units: single actions and overlapped pairs."""
    out, n = [], 0
    while n < len(acts):
        size = 2 if acts[n].overlap_with_next else 1
        out.append(list(range(n, n + size)))
        n += size
    return out


_Part = tuple[str, int, bool]
"""One action of a unit: (kind, chunk, whether its backward is split)."""


@dataclass(frozen=True, slots=True)
class CompiledSchedule:
    """A schedule's units (single actions and overlapped pairs) in an order every unit's inputs precede,
    with their inputs resolved to unit numbers: timing it with other costs is one pass (what
    :func:`makespan` computes, without re-validating or re-resolving the schedule each time).

    ``units``: per unit, its stage, its inputs as (unit, chunk whose ``p2p_s`` it adds, or -1 when the
    input is on the same stage) and its actions; ``p``: stages."""

    units: tuple[tuple[int, tuple[tuple[int, int], ...], tuple[_Part, ...]], ...]
    p: int

    def stage_ends(self, costs: Sequence[Sequence[ActionCosts]]) -> tuple[float, ...]:
        """When each stage ends its last unit, with ``costs[stage][chunk]`` (as :func:`makespan`)."""
        end = [0.0] * len(self.units)
        free = [0.0] * self.p
        for u, (s, inputs, parts) in enumerate(self.units):
            t = free[s]
            row = costs[s]
            for dep, chunk in inputs:
                e = end[dep] + (row[chunk].p2p_s if chunk >= 0 else 0.0)
                if e > t:
                    t = e
            if len(parts) == 2 and row[parts[0][1]].fb_s is not None:
                dur = row[parts[0][1]].fb_s or 0.0
            else:
                dur = 0.0
                for kind, chunk, split in parts:
                    c = row[chunk]
                    dur += c.f_s if kind == "F" else c.w_s if kind == "W" else c.b_s if split else c.b_s + c.w_s
            end[u] = free[s] = t + dur
        return tuple(free)


def compile_schedule(schedule: Sequence[Sequence[Action]], route: Route | None = None) -> CompiledSchedule:
    """Validate ``schedule`` once and resolve it for :meth:`CompiledSchedule.stage_ends`."""
    route = route or default_route(schedule)
    validate_schedule(schedule, route)
    run = _Run(schedule, lambda stage, chunk: UNIT_COSTS, route)
    run.execute()
    number = {key: n for n, key in enumerate(run.order)}
    unit_of: dict[tuple[str, int, int, int], int] = {}
    units = []
    for s, i in run.order:
        idx = run.units[s][i]
        inputs: list[tuple[int, int]] = []  # the stage's previous unit is its free time
        for n in idx:
            a = schedule[s][n]
            for key in run._inputs(s, a):
                src = unit_of[key]
                inputs.append((src, a.chunk if key[2] != s else -1))
        parts = tuple((schedule[s][n].kind, schedule[s][n].chunk,
                       (schedule[s][n].microbatch, schedule[s][n].chunk) in run.splits[s]) for n in idx)
        for n in idx:
            a = schedule[s][n]
            unit_of[(a.kind, a.microbatch, s, a.chunk)] = number[(s, i)]
        units.append((s, tuple(inputs), parts))
    return CompiledSchedule(tuple(units), run.p)
