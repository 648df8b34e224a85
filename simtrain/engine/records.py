"""What the engine records and returns: a rank's memory ledger, its busy/idle statistics, trace events and
the EngineResult (seconds, bytes)."""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from simtrain.cost.collectives import (
    Plan,
)
from simtrain.lower.ops import (
    Op,
)

#: Rank end times this close (relative to the step) are a tie for the critical rank.
TIE_REL_TOL = 1e-9


@dataclass(slots=True)
class _Sharing:
    """Who uses which edges: per (rank, op indices, entry, owner) signature, its edges and each edge's owners."""

    uses: list[tuple[int, list[int], tuple[float, list[list[tuple[Any, ...]]], str], Any]]
    edges_of: dict[tuple[int, Any], set[Any]]
    owners: dict[Any, set[Any]]


class PointTimeline(Sequence[tuple[float, float]]):
    """A run's memory timeline, (time s, bytes) points, in two float arrays: 16 bytes a point instead
    of a tuple's ~110, for every rank of a full-mode run (millions of points at a thousand ranks).
    Floats are stored as they are (doubles), so points read back exactly."""

    __slots__ = ("_t", "_v")

    def __init__(self, points: Sequence[tuple[float, float]] = ()):
        self._t = array("d", (p[0] for p in points))
        self._v = array("d", (p[1] for p in points))

    def append(self, point: tuple[float, float]) -> None:
        """Add one (time s, bytes) point at the end."""
        self._t.append(point[0])
        self._v.append(point[1])

    def __len__(self) -> int:
        return len(self._t)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[float, float]]: ...

    def __getitem__(self, i: int | slice) -> tuple[float, float] | list[tuple[float, float]]:
        if isinstance(i, slice):
            return list(zip(self._t[i], self._v[i], strict=True))
        return self._t[i], self._v[i]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self._t, self._v, strict=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(p == tuple(q) for p, q in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it replaces

    def __repr__(self) -> str:
        return f"PointTimeline({len(self)} points)"


@dataclass(slots=True)
class Ledger:
    """Memory of one rank over the step: current bytes by tag, the peak and its timeline."""

    current: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    total: float = 0.0
    peak: float = 0.0
    at_peak: dict[str, float] = field(default_factory=dict)
    timeline: Sequence[tuple[float, float]] = field(default_factory=PointTimeline)
    """(time s, bytes) after each change: a ``PointTimeline`` an engine run appends to; a steady-state
    extension stores its repeating periods once (``steady.PeriodicTimeline``)."""
    min_total: float = 0.0

    def apply(self, now: float, deltas: tuple[tuple[str, float], ...]) -> None:
        """Apply (tag, bytes) deltas at time ``now``."""
        for tag, nbytes in deltas:
            self.current[tag] += nbytes
            self.total += nbytes
        self.min_total = min(self.min_total, self.total)
        self.timeline.append((now, self.total))  # type: ignore[attr-defined]  # a run's ledger: a PointTimeline
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.current)


@dataclass(slots=True)
class RankStats:
    """What one simulated rank did: stream busy times, idle attribution, end time."""

    end_s: float = 0.0
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    exposed: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    bubble_s: float = 0.0
    flops: float = 0.0
    last_compute_end_s: float = 0.0
    last_axis: str = "other"


@dataclass(slots=True)
class TraceEvent:
    """One executed op: rank, stream, name, category, start and end (seconds)."""

    rank: int
    stream: str
    name: str
    category: str
    start_s: float
    end_s: float
    op: Op
    peer: int = -1
    """A pipeline send's destination rank, or the rank whose send this op waits for (``op.remote``); else -1."""
    group: tuple[int, ...] = ()
    """A collective's process group (ranks); empty for other ops."""
    algorithm: str = ""
    """A collective's algorithm/protocol as the planner chose it (e.g. "ring/simple"); "" if unknown."""


@dataclass(slots=True)
class EngineResult:
    """Everything the engine measured."""

    step_time_s: float
    ranks: list[int]
    stats: dict[int, RankStats]
    ledgers: dict[int, Ledger]
    trace: list[TraceEvent]
    ops_executed: int
    plans: dict[Any, Plan]
    notes: list[str] = field(default_factory=list)
    """What the engine did that the result should say (e.g. full mode fell back to every rank)."""

    def critical_rank(self) -> int:
        """The rank that finishes last, whose step ``StepResult.breakdown_s`` explains: the lowest such
        rank when several end together, ends within ``TIE_REL_TOL`` of the step counting as together
        (so float rounding in a tie, e.g. 1F1B's first and last stages, does not pick the rank)."""
        last = max(self.stats[r].end_s for r in self.ranks)
        return min(r for r in self.ranks if self.stats[r].end_s >= last - TIE_REL_TOL * last)
