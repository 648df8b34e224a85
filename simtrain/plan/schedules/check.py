"""Checks of a schedule's action lists: completeness and order (:func:`validate_schedule`)."""

from __future__ import annotations

from collections.abc import Sequence

from simtrain.plan.schedules.base import Action, Route, RouteShape, ScheduleError


def validate_schedule(schedule: Sequence[Sequence[Action]], route: Route | None = None) -> None:
    """Raise :class:`ScheduleError` unless the schedule is complete and ordered.

    Every stage holds, for every micro-batch whose path visits it (``route``, default the
    chunk-major interleaved route with ``v`` = the largest chunk + 1), exactly one F and one B per
    visited chunk and at most one W, in the order F, B, W; an ``overlap_with_next`` F is followed by
    a B of another micro-batch. Micro-batches are numbered ``0 .. m - 1``. Deadlocks are found by
    :func:`makespan`.
    """
    route = route or default_route(schedule)
    problems: list[str] = []
    if len(schedule) != route.p:
        problems.append(f"{len(schedule)} stage lists for p={route.p}")
    mbs = sorted({a.microbatch for acts in schedule for a in acts})
    if mbs != list(range(len(mbs))):
        problems.append(f"micro-batches are not numbered 0..m-1: {mbs[:8]}...")
    visits: list[set[tuple[int, int]]] = [set() for _ in schedule]
    for i in mbs:
        for st, c in route.path(i):
            if st < len(visits):
                visits[st].add((i, c))
    for s, acts in enumerate(schedule):
        problems += _stage_problems(s, acts, visits[s])
    if problems:
        shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
        raise ScheduleError(f"invalid schedule: {shown}")


def _stage_problems(s: int, acts: Sequence[Action], expected: set[tuple[int, int]]) -> list[str]:
    """Completeness, uniqueness, order and overlap problems of one stage's list."""
    out: list[str] = []
    pos: dict[tuple[str, int, int], int] = {}
    for n, a in enumerate(acts):
        key = (a.kind, a.microbatch, a.chunk)
        if a.kind not in ("F", "B", "W"):
            out.append(f"stage {s} action #{n}: unknown kind {a.kind!r}")
        elif key in pos:
            out.append(f"stage {s}: {action_name(a)} appears twice (#{pos[key]} and #{n})")
        pos.setdefault(key, n)
        if a.overlap_with_next:
            out += _overlap_problems(s, n, acts)
    for kind in ("F", "B"):
        have = {(i, c) for k, i, c in pos if k == kind}
        if have != expected:
            missing, extra = sorted(expected - have)[:3], sorted(have - expected)[:3]
            out.append(f"stage {s}: {kind} passes missing for (mb, chunk) {missing}, unexpected {extra} "
                       f"(is the route right? see schedule_route)")
    for (kind, i, c), n in pos.items():
        before = {"B": "F", "W": "B"}.get(kind)
        if before and pos.get((before, i, c), n) > n:
            out.append(f"stage {s}: {kind}(mb={i}, chunk={c}) at #{n} runs before its {before}")
        if kind == "W" and (before, i, c) not in pos:
            out.append(f"stage {s}: W(mb={i}, chunk={c}) has no B")
    return out


def _overlap_problems(s: int, n: int, acts: Sequence[Action]) -> list[str]:
    a = acts[n]
    nxt = acts[n + 1] if n + 1 < len(acts) else None
    if a.kind != "F" or nxt is None or nxt.kind != "B" or nxt.microbatch == a.microbatch:
        return [f"stage {s} action #{n}: overlap_with_next must be an F followed by a B of another micro-batch"]
    return []


def action_name(a: Action) -> str:
    """``F(mb=3, chunk=0)``: an action in messages."""
    return f"{a.kind}(mb={a.microbatch}, chunk={a.chunk})"


def default_route(schedule: Sequence[Sequence[Action]]) -> Route:
    """The chunk-major interleaved route with ``v`` = the largest chunk + 1 (one-chunk schedules: v = 1)."""
    v = 1 + max((a.chunk for acts in schedule for a in acts), default=0)
    return Route(RouteShape.INTERLEAVED, len(schedule), v)


