"""Steady-state extrapolation of long gradient accumulation: simulate a few pipeline periods, extend.

A training step with m micro-batches per pipeline is a fill, a run of identical periods and a drain.
The pipeline schedules repeat every p micro-batches in their steady state (1F1B: one forward and one
backward per stage per micro-batch; interleaved 1F1B: the v model chunks of a group of p micro-batches,
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", Sec. 2.2;
DualPipe: a pair of micro-batches from each end, so 2p here to be safe; each schedule object's
``Schedule.period``), and the engine is deterministic (no randomness, flows recomputed identically), so
on micro-batch counts m = m1 + kP every quantity the engine measures (step time, per-rank busy and
exposed time, bubble, FLOPs, memory peaks) is affine in k.

``plan`` picks m1 (a period past the least count the schedule allows, congruent to m mod P); the
caller simulates m1, m1 + P, m1 + 2P, ... while their sum stays within 0.6 m, and ``extrapolate`` takes
the engine's results at the last three, checks that every quantity's second difference vanishes (its
extension error within ``ERR_TOL`` of its scale: the steady state was reached) and that the memory
timelines repeat, and returns the result the engine would give at m: each quantity extended linearly,
each timeline extended by the missing periods. Any doubt returns None: the caller tries the next
three or simulates every micro-batch. Tested against full simulations of the published and archive
runs: equal up to float rounding (~1e-13 of the step) on all but three, where the full step leaves
the line the short runs were on only late in the step: Llama 3.1 405B on GB200, PP16 with 384
micro-batches, where runs of 32 to 336 micro-batches lie on one line to 1e-12 s and 352 and 384 do
not (the full step 2.6 ms or 5e-5 longer than the extension; the other two rows 1e-7, in the
breakdown only). Checks on three short runs cannot see such a late departure; its size is that of
the steady state's own slack (the pipeline's stages settling into a slightly different period late
in the step). Memory timeline events move by up to 1.6e-4 of the step and 1e-6 of the peak
(``TIMELINE_TOL``; an event reordered near the drain, while every peak stays exact).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from simtrain.engine.records import EngineResult, Ledger, RankStats
from simtrain.plan.schedules import Schedule, schedule_of

#: Largest extrapolation error accepted, relative to the quantity's scale (the step time for times, the
#: largest memory peak for bytes, the largest FLOP count for FLOPs). A quantity passes when its second
#: difference over the three runs, times the k + 1 periods it is extended by, stays within it: float
#: rounding gives ~1e-13, an engine near-tie flipping in one period ~1e-7 of the step.
ERR_TOL = 1e-5

#: The short runs together simulate at most this fraction of the full step's micro-batches (so a
#: shortcut taken is at least 1.6x faster, and one declined costs at most 1.6x). Interleaved 1F1B with
#: many chunks can need a fourth run before three lie on one line (Llama 3.1 405B, PP8 VP8 on H100:
#: 16, 24, 32 off by 6e-5 of the step, 24, 32, 40 on one line to 1e-14).
MAX_WORK_FRACTION = 0.6

#: Short runs tried at most before simulating every micro-batch: the steady state shows within the
#: first few periods (three runs on the examples, a fourth for Llama 3.1 405B PP8 VP8), and a cap keeps
#: the largest short run, hence the time and memory of the shortcut, independent of the micro-batch count.
MAX_SHORT_RUNS = 12

#: Memory timelines (for plots: ``--timeline``, sweeps, reports) may shift an event by this fraction of
#: the step and still count as repeating: where flows of the drain meet the last periods' gradient
#: buckets, one more period can move a drain event by ~1e-4 of the step (Llama 3 70B, PP8 VP5 on H100:
#: 0.7 ms of 6.2 s) while every total, end time and peak stays on its line.
TIMELINE_TOL = 1e-3

Timeline = Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class SteadyPlan:
    """The short runs for a step of ``target`` micro-batches per pipeline: ``first``, first + P, ...
    (P = ``period``), as many as the work budget allows; the last three that lie on one line win."""

    first: int
    period: int
    target: int

    def counts(self) -> Iterator[int]:
        """Micro-batch counts to simulate in turn, while their sum stays within the budget
        (``MAX_WORK_FRACTION`` of the target), each is short of the target, and at most
        ``MAX_SHORT_RUNS`` of them (so the largest, and the simulation's memory, does not grow with
        the target)."""
        count, spent = self.first, 0
        for _ in range(MAX_SHORT_RUNS):
            if count >= self.target or spent + count > MAX_WORK_FRACTION * self.target:
                return
            yield count
            spent += count
            count += self.period

    def periods_added(self, last: int) -> int:
        """Periods of P micro-batches the extrapolation adds to a last short run of ``last``."""
        return (self.target - last) // self.period

    def note(self, used: Sequence[int], simulated: int) -> str:
        """What was done, for ``StepResult.notes``."""
        a, b, c = used
        return (f"steady state: simulated {a}, {b} and {c} micro-batches ({simulated} in all) and extended "
                f"the last by {self.periods_added(c)} identical pipeline periods of {self.period} to "
                f"{self.target} (sim.steady_state: false simulates every micro-batch)")


def plan(schedule: Schedule | str, pp: int, microbatches: int) -> SteadyPlan | None:
    """The short runs for a step of ``microbatches`` per pipeline under ``schedule`` (a schedule object or
    a registered name; any other name raises ``UnknownSchedule``) on ``pp`` stages, or None when even
    three of them would exceed the work budget. The period and least count are the schedule's: its
    ``period``, else, when three runs that far apart do not fit the budget, its ``short_period``."""
    sched = schedule if isinstance(schedule, Schedule) else schedule_of(schedule)
    least = sched.least_microbatches(pp)
    for period in dict.fromkeys((sched.period(pp), sched.short_period(pp))):
        first = microbatches % period or period
        while first < least + period:  # one period past the schedule's least count: interleaved 1F1B at
            first += period            # m = p caps its warm-up, and its steady state starts a period later
        steady = SteadyPlan(first, period, microbatches)
        if len(list(steady.counts())) >= 3:
            return steady
    return None


def extrapolate(results: Sequence[EngineResult], k: int) -> EngineResult | None:
    """The engine's result k periods beyond the last of three runs a period apart; None when the three
    are not in one affine steady state (the caller then tries later runs or every micro-batch)."""
    a, b, c = results
    if a.ranks != b.ranks or b.ranks != c.ranks:
        return None
    t_tol = ERR_TOL * c.step_time_s
    b_tol = ERR_TOL * max(max(lg.peak for lg in r.ledgers.values()) for r in results)
    f_tol = ERR_TOL * max(max(st.flops for st in r.stats.values()) for r in results)
    try:
        stats = {r: _stats(a.stats[r], b.stats[r], c.stats[r], k, t_tol, f_tol) for r in c.ranks}
        ledgers = {r: _ledger(a.ledgers[r], b.ledgers[r], c.ledgers[r], k, b_tol, TIMELINE_TOL * c.step_time_s)
                   for r in c.ranks}
        step = _line(a.step_time_s, b.step_time_s, c.step_time_s, k, t_tol)
        out = EngineResult(step, list(c.ranks), stats, ledgers, [],
                           a.ops_executed + b.ops_executed + c.ops_executed, c.plans,
                           list(dict.fromkeys(a.notes + b.notes + c.notes)))
        critical = out.critical_rank()
        _check_idle(a.stats[critical], b.stats[critical], c.stats[critical], k, t_tol)
    except _NotSteady:
        return None
    return out


class _NotSteady(Exception):
    """The three short runs do not lie on one line: no steady state within them."""


def _line(x1: float, x2: float, x3: float, k: int, tol: float) -> float:
    """x3 extended by k steps of (x3 - x2), after checking that x1, x2, x3 are equally spaced enough
    for the error of doing so, about (k + 1) times their second difference, to stay within tol."""
    if (k + 1) * abs(x3 - 2.0 * x2 + x1) > tol:
        raise _NotSteady
    return x3 + k * (x3 - x2)


def _lines(d1: dict[str, float], d2: dict[str, float], d3: dict[str, float], k: int,
           tol: float) -> dict[str, float]:
    keys = list(dict.fromkeys([*d3, *d2, *d1]))
    return {key: _line(d1.get(key, 0.0), d2.get(key, 0.0), d3.get(key, 0.0), k, tol) for key in keys}


def _stats(s1: RankStats, s2: RankStats, s3: RankStats, k: int, t_tol: float, f_tol: float) -> RankStats:
    """A rank's stats extended by k periods. Its end time, stream busy times and FLOPs must be steady
    (they pick the critical rank, the slowest stage's compute and the hardware FLOPs); how its idle time
    splits between exposed communication and bubble is checked on the critical rank only
    (``_check_idle``), the one ``StepResult.breakdown_s`` reads: on others it may repeat over a multiple
    of the period."""
    out = RankStats()
    out.end_s = _line(s1.end_s, s2.end_s, s3.end_s, k, t_tol)
    out.busy.update(_lines(s1.busy, s2.busy, s3.busy, k, t_tol))
    out.flops = _line(s1.flops, s2.flops, s3.flops, k, f_tol)
    unchecked = float("inf")
    out.exposed.update(_lines(s1.exposed, s2.exposed, s3.exposed, k, unchecked))
    out.bubble_s = _line(s1.bubble_s, s2.bubble_s, s3.bubble_s, k, unchecked)
    out.last_compute_end_s = _line(s1.last_compute_end_s, s2.last_compute_end_s, s3.last_compute_end_s, k, unchecked)
    out.last_axis = s3.last_axis
    return out


def _check_idle(s1: RankStats, s2: RankStats, s3: RankStats, k: int, t_tol: float) -> None:
    """The critical rank's idle time splits the same way in every period."""
    if not s1.last_axis == s2.last_axis == s3.last_axis:
        raise _NotSteady
    _lines(s1.exposed, s2.exposed, s3.exposed, k, t_tol)
    _line(s1.bubble_s, s2.bubble_s, s3.bubble_s, k, t_tol)
    _line(s1.last_compute_end_s, s2.last_compute_end_s, s3.last_compute_end_s, k, t_tol)


def _ledger(l1: Ledger, l2: Ledger, l3: Ledger, k: int, b_tol: float, t_tol: float) -> Ledger:
    out = Ledger()
    out.current.update(_lines(l1.current, l2.current, l3.current, k, b_tol))
    out.total = _line(l1.total, l2.total, l3.total, k, b_tol)
    out.peak = _line(l1.peak, l2.peak, l3.peak, k, b_tol)
    out.at_peak = _lines(l1.at_peak, l2.at_peak, l3.at_peak, k, b_tol)
    out.min_total = _line(l1.min_total, l2.min_total, l3.min_total, k, b_tol)
    out.timeline = _timeline(l1.timeline, l2.timeline, l3.timeline, k, t_tol, b_tol)
    return out


def _timeline(t1: Timeline, t2: Timeline, t3: Timeline, k: int, t_tol: float, b_tol: float) -> Timeline:
    """The memory timeline k periods longer than ``t3``, after checking that extending ``t2`` by one
    period the same way gives back ``t3``."""
    d2 = _period_shift(t1, t2)
    d3 = _period_shift(t2, t3)
    if d2 is None or d3 is None or abs(d3 - d2) > t_tol:
        raise _NotSteady
    if not _same(_extend(t1, t2, d2, 1, t_tol, b_tol), t3, t_tol, b_tol):
        raise _NotSteady
    return _extend(t2, t3, d3, k, t_tol, b_tol)


def _period_shift(short: Timeline, long: Timeline) -> float | None:
    """The time one period adds: the shift between the two timelines' last points (the drain is the
    same, later)."""
    if not short or len(long) <= len(short):
        return None
    return long[-1][0] - short[-1][0]


class PeriodicTimeline(Sequence[tuple[float, float]]):
    """A memory timeline (time s, bytes) stored as ``head``, then ``period`` repeated ``k`` more times,
    each ``shift`` seconds later, then ``tail`` moved k shifts later: the extended timeline of a long
    step in O(one short run) memory whatever k (the micro-batch count), its points made on access."""

    __slots__ = ("head", "period", "tail", "shift", "k")

    def __init__(self, head: Timeline, period: Timeline, tail: Timeline, shift: float, k: int):
        self.head, self.period, self.tail, self.shift, self.k = head, period, tail, shift, k

    def __len__(self) -> int:
        return len(self.head) + self.k * len(self.period) + len(self.tail)

    def _at(self, i: int) -> tuple[float, float]:
        if i < len(self.head):
            return self.head[i]
        i -= len(self.head)
        n = len(self.period)
        if i < self.k * n:
            c, j = divmod(i, n)
            t, v = self.period[j]
            return (t + (c + 1) * self.shift, v)
        t, v = self.tail[i - self.k * n]
        return (t + self.k * self.shift, v)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[float, float]]: ...

    def __getitem__(self, i: int | slice) -> tuple[float, float] | list[tuple[float, float]]:
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._at(i)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        yield from self.head
        for c in range(1, self.k + 1):
            for t, v in self.period:
                yield (t + c * self.shift, v)
        for t, v in self.tail:
            yield (t + self.k * self.shift, v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(
            p == q for p, q in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"PeriodicTimeline({len(self.head)} points, {self.k} x {len(self.period)}, "
                f"{len(self.tail)} points)")


def _extend(short: Timeline, long: Timeline, shift: float, k: int, t_tol: float,
            b_tol: float) -> PeriodicTimeline:
    """``long`` with k more periods, where ``long`` is ``short`` with one more: the runs agree until
    ``short`` starts to drain (index i); there ``long`` runs one more period X (its next n points,
    n = len(long) - len(short)) before its own drain, so k copies of X, each ``shift`` later, go after
    it and the drain moves k shifts later (stored once: ``PeriodicTimeline``)."""
    n = len(long) - len(short)
    i = 0
    while i < len(short) and _close(short[i], long[i], 0.0, t_tol, b_tol):
        i += 1
    if i + n > len(long):
        raise _NotSteady
    return PeriodicTimeline(list(long[:i + n]), list(long[i:i + n]), list(long[i + n:]), shift, k)


def _close(p: tuple[float, float], q: tuple[float, float], shift: float, t_tol: float, b_tol: float) -> bool:
    return abs(p[0] + shift - q[0]) <= t_tol and abs(p[1] - q[1]) <= b_tol


def _same(x: Timeline, y: Timeline, t_tol: float, b_tol: float) -> bool:
    return len(x) == len(y) and all(_close(p, q, 0.0, t_tol, b_tol) for p, q in zip(x, y, strict=True))


def affine_at(values: Sequence[float], k: int) -> float:
    """A value k periods beyond the last of three runs a period apart (a per-stage closed-form peak,
    bytes: lowering's closed forms are affine in m, e.g. torch pipelining's per-micro-batch buffers)."""
    x1, x2, x3 = values
    return _line(x1, x2, x3, k, float("inf"))
