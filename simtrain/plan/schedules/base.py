"""What every pipeline schedule is: actions, routes, the :class:`Schedule` interface and its registry.

A schedule returns, for every pipeline stage (rank), the ordered list of
``Action(kind, microbatch, chunk, overlap_with_next)`` that stage executes; the engine runs whatever
list it is given. ``chunk`` is the model chunk index on that rank (always 0 without interleaving);
which model stage a chunk holds, and the path a micro-batch takes through ``(stage, chunk)`` pairs,
is the schedule's :class:`Route`.

Action kinds
------------
- ``"F"``: forward of one micro-batch on one chunk.
- ``"B"``: backward. **It is the full backward (input and weight gradients) unless the same stage's
  list also holds a ``"W"`` for that (micro-batch, chunk)**; then it is the input-gradient part only
  (Qi et al. 2023's "B") and the ``"W"`` is the weight-gradient part. Schedules without W
  (GPipe, 1F1B, interleaved 1F1B) are unchanged; ZB-H1 splits every backward; DualPipe splits some
  (:func:`split_backward_keys` gives the split ones per stage, :func:`splits_backward` whether any).
- ``"W"``: weight-gradient pass of a split backward; it always follows its ``"B"`` on the same stage.
- ``overlap_with_next=True`` (only on an ``"F"``): this forward and the next action in the list, a
  ``"B"`` of a different micro-batch, run as one overlapped "F&B" unit (DeepSeek-V3 sec. 3.2.1:
  the forward chunk of one micro-batch overlapped with the backward chunk of another, so each
  one's all-to-all and pipeline communication hide behind the other's computation). A consumer that
  ignores the flag runs them back to back, which is correct but slower.

Memory rule (:func:`max_in_flight`, :func:`max_pending_weight_grads`)
--------------------------------------------------------------------
An ``"F"`` allocates the micro-batch's activations; its ``"B"`` frees them (full backward: all of
them; input-gradient backward: all but what the weight gradient needs, i.e. the inputs of the
weight GEMMs and the output gradients, Qi et al. 2023 sec. 2 "M_W"); the ``"W"`` frees that rest.
So the activation peak is ``max_in_flight`` x a micro-batch chunk's activations plus
``max_pending_weight_grads`` x its W-retained part. An overlapped pair counts its F before its B.

Schedules as objects
--------------------
Each schedule is one :class:`Schedule` subclass in its own module of this package; it owns its
action lists, route, chunks per stage, steady-state period and least micro-batch count, the
micro-batches in flight per stage, whether it splits backward and overlaps F&B, and its constraints
(as :class:`simtrain.spec.errors.Problem`, with the config field's dotted path). Callers (validation,
search, lowering, the estimate, the steady-state shortcut, the formats) ask the object and never
compare names. The registry (:class:`ScheduleRegistry`, the package's ``REGISTRY``) maps the name a
config gives (``layout.schedule``) to the object; an unknown name raises :class:`UnknownSchedule`.

Adding a schedule: write one module with a :class:`Schedule` subclass and register an instance
(``REGISTRY.register``, or import it in the package ``__init__`` beside the built-in ones); the
config's ``layout.schedule`` accepts any registered name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, NamedTuple

from simtrain.spec.errors import Problem
from simtrain.spec.schedule_names import ScheduleNames


class Action(NamedTuple):
    """One unit of pipeline work on one model chunk of one micro-batch (see the module docstring)."""

    kind: str
    microbatch: int
    chunk: int
    overlap_with_next: bool = False


class ScheduleError(ValueError):
    """A schedule that is incomplete, out of order, or deadlocks; or one that cannot be built."""


class UnknownSchedule(ScheduleError):
    """A schedule name that no registered :class:`Schedule` has."""

    def __init__(self, kind: object, known: Iterable[str]):
        self.kind, self.known = kind, tuple(known)
        super().__init__(f"unknown schedule {kind!r}; known: {', '.join(self.known)}")


# -- routes: where each micro-batch goes ------------------------------------------------------
class RouteShape(StrEnum):
    """How a micro-batch's forward path crosses the ``(stage, chunk)`` pairs (see :class:`Route`)."""

    INTERLEAVED = "interleaved"
    DUALPIPE = "dualpipe"
    V = "v"


@dataclass(frozen=True, slots=True)
class Route:
    """The forward path of every micro-batch through ``(stage, chunk)`` pairs.

    ``shape`` is ``"interleaved"`` (chunk-major: stages ``0..p-1`` of chunk 0, then of chunk 1, ...,
    Megatron's virtual stages ``chunk * p + stage``; GPipe, 1F1B and ZB-H1 are ``v = 1``),
    ``"dualpipe"`` (micro-batches below ``m // 2`` go ranks ``0 -> p-1`` on chunk 0, the others
    ranks ``p-1 -> 0`` on chunk 1) or ``"v"`` (ranks ``0 -> p-1`` on chunk 0 then ``p-1 -> 0`` on
    chunk 1). Backward passes walk the path in reverse. ``v`` is the chunks per stage.
    """

    shape: RouteShape
    p: int
    v: int = 1
    m: int = 0

    @property
    def length(self) -> int:
        """Number of hops (model stages) on a micro-batch's path."""
        return self.p if self.shape == RouteShape.DUALPIPE else self.p * self.v

    def at(self, microbatch: int, position: int) -> tuple[int, int]:
        """``(stage, chunk)`` of the ``position``-th model stage on a micro-batch's path."""
        p = self.p
        if self.shape == RouteShape.INTERLEAVED:
            return position % p, position // p
        if self.shape == RouteShape.DUALPIPE:
            return (position, 0) if microbatch < self.m // 2 else (p - 1 - position, 1)
        return (position, 0) if position < p else (2 * p - 1 - position, 1)

    def position(self, microbatch: int, stage: int, chunk: int) -> int:
        """Index of ``(stage, chunk)`` on a micro-batch's path (its model stage)."""
        p = self.p
        if self.shape == RouteShape.INTERLEAVED:
            return chunk * p + stage
        if self.shape == RouteShape.DUALPIPE:
            return stage if chunk == 0 else p - 1 - stage
        return stage if chunk == 0 else 2 * p - 1 - stage

    def path(self, microbatch: int) -> list[tuple[int, int]]:
        """The whole forward path of a micro-batch."""
        return [self.at(microbatch, k) for k in range(self.length)]


# -- the schedule interface ----------------------------------------------------------------------
class Schedule(ABC):
    """One pipeline schedule: its action lists and every fact callers need about it.

    Counts are micro-batches (``m``) per pipeline, stages (``p``, ``layout.pp``) and chunks per stage
    (``v``, ``layout.vpp``). Subclasses set the class attributes and implement :meth:`actions`;
    the defaults describe a one-chunk schedule on the interleaved route with period ``p``.
    """

    kind: ClassVar[str]
    """The name configs use (``layout.schedule``); a :class:`ScheduleKind` for the built-in ones."""
    title: ClassVar[str]
    """The name in messages, e.g. "DualPipe"."""
    chunks: ClassVar[int | None] = 1
    """Model chunks per stage the schedule places itself (DualPipe/V: 2), or None: ``layout.vpp``."""
    splits_backward: ClassVar[bool] = False
    """Whether some backward is split into B (input gradients) and W (weight gradients)."""
    overlaps_forward_backward: ClassVar[bool] = False
    """Whether it runs overlapped F&B pairs, so each chunk's MoE all-to-alls hide behind the other's
    compute (DeepSeek-V3 sec. 3.2.1)."""
    uniform_bubble: ClassVar[bool] = False
    """Whether its bubble is ``(p - 1) / v`` of a stage's work per micro-batch (GPipe, 1F1B,
    interleaved 1F1B; Narayanan et al. 2021 sec. 2.2), so a closed form times it; otherwise
    :func:`simtrain.plan.schedules.makespan` times its action lists."""

    @abstractmethod
    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        """Per stage, the ordered actions of one step of ``m`` micro-batches (raises ValueError
        when the schedule cannot run them)."""

    def route(self, p: int, m: int, v: int = 1) -> Route:
        """The :class:`Route` of :meth:`actions` with the same arguments."""
        return Route(RouteShape.INTERLEAVED, p, 1, m)

    def chunks_per_stage(self, v: int) -> int:
        """Model chunks each stage holds under ``layout.vpp = v``."""
        return self.chunks or v

    def period(self, p: int) -> int:
        """Micro-batches per period of the steady state (every quantity the engine measures is affine
        in the number of periods past it): ``p`` (one forward and backward per stage per micro-batch;
        interleaved: the chunks of a group of ``p``)."""
        return max(p, 1)

    def short_period(self, p: int) -> int:
        """The shortest period of the steady state, micro-batches: what the steady-state shortcut falls back to
        when three runs ``period`` apart would exceed its work budget (a deep pipeline with few micro-batches
        per stage). ``period`` itself unless the schedule's steady state repeats with every micro-batch."""
        return self.period(p)

    def least_microbatches(self, p: int) -> int:
        """Least micro-batch count of a full pipeline (the steady-state shortcut starts a period past it)."""
        return p

    def chunk_runs(self, m: int) -> int:
        """Micro-batches through each chunk of a stage (all ``m`` unless the schedule splits them)."""
        return m

    def in_flight(self, p: int, stage: int, m: int) -> int | None:
        """Micro-batches alive (forward run, backward not yet) at most on ``stage`` of a one-chunk
        schedule, in closed form; None: walk the action lists (:func:`max_in_flight`)."""
        return None

    def steady_microbatches(self, p: int) -> int:
        """Micro-batches (even) past which the memory peak no longer grows and the makespan grows
        linearly by :meth:`period` (``2p + 4``: checked for ZB-H1, DualPipe and DualPipeV against full
        schedules of 2 to 16 stages and up to 8 x pp micro-batches)."""
        return 2 * p + 4

    def peak_microbatches(self, p: int, m: int) -> int:
        """Micro-batches of a schedule whose action lists reach the full step's memory peak."""
        return min(m, self.steady_microbatches(p))

    def layout_problems(self, p: int, v: int, n_layers: int) -> list[Problem]:
        """Problems of running this schedule on ``p`` stages of ``v`` chunks for ``n_layers`` layers:
        paths ``layout.schedule`` / ``layout.vpp``."""
        out = self.layer_problems(p, v, n_layers)
        if v > 1 and self.chunks is not None:
            out.append(Problem("layout.schedule", f"{str(self.kind)!r} cannot run vpp={v}; use interleaved_1f1b"))
        return out

    def layer_problems(self, p: int, v: int, n_layers: int) -> list[Problem]:
        """Every model stage on the route but the first and last (which may hold only the embedding and
        the head: ``lowering.layers_by_position`` takes layers from them first) needs a layer. More stages
        than layers (``p > n_layers``) is ``layout.pp``'s problem, reported by validation."""
        stages = self.route(p, 0, v).length
        if p <= n_layers < stages - 2:
            return [Problem("layout.schedule", f"{str(self.kind)!r} places {stages} model stages on each "
                                               f"micro-batch's path; all but the first and last need a layer, so "
                                               f"at least {stages - 2} layers, model.n_layers={n_layers}")]
        return []

    def microbatch_problems(self, p: int, m: int, path: str) -> list[Problem]:
        """Problems of running ``m`` micro-batches per pipeline on ``p`` stages; ``path`` is the
        config field that sets ``m`` (the global batch)."""
        return []

    def problems(self, p: int, v: int, m: int, n_layers: int, path: str) -> list[Problem]:
        """Every problem of :meth:`layout_problems` and :meth:`microbatch_problems`."""
        return self.layout_problems(p, v, n_layers) + self.microbatch_problems(p, m, path)


# -- the registry ------------------------------------------------------------------------------------
class ScheduleRegistry:
    """Schedules by name (:attr:`Schedule.kind`), in registration order.

    ``names``: the config's list of accepted names (``simtrain.spec.schedule_names.SCHEDULE_NAMES`` for the
    package's ``REGISTRY``), kept in step with this registry: a registered name is accepted, an
    unregistered one refused."""

    def __init__(self, schedules: Iterable[Schedule] = (), names: ScheduleNames | None = None) -> None:
        self._by_kind: dict[str, Schedule] = {}
        self._names = names
        for s in schedules:
            self.register(s)

    def register(self, schedule: Schedule) -> Schedule:
        """Add a schedule; its name must be new (and not ``auto``, the config's default)."""
        kind = str(schedule.kind)
        if kind in self._by_kind or kind == "auto":
            raise ValueError(f"a schedule named {kind!r} is already registered")
        self._by_kind[kind] = schedule
        if self._names is not None:
            self._names.add(kind)
        return schedule

    def unregister(self, kind: str) -> None:
        """Remove a schedule by name."""
        if kind not in self._by_kind:
            raise UnknownSchedule(kind, self.kinds())
        del self._by_kind[kind]
        if self._names is not None:
            self._names.discard(kind)

    @contextmanager
    def registered(self, schedule: Schedule) -> Iterator[Schedule]:
        """Register ``schedule`` for the ``with`` block only (tests, one-off studies)."""
        self.register(schedule)
        try:
            yield schedule
        finally:
            self.unregister(str(schedule.kind))

    def get(self, kind: str) -> Schedule:
        """The schedule of that name; :class:`UnknownSchedule` when none has it."""
        try:
            return self._by_kind[kind]
        except (KeyError, TypeError):
            raise UnknownSchedule(kind, self.kinds()) from None

    def kinds(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._by_kind)

    def __contains__(self, kind: object) -> bool:
        return isinstance(kind, str) and kind in self._by_kind


# -- facts of action lists -----------------------------------------------------------------------------
def splits_backward(schedule: Sequence[Sequence[Action]]) -> bool:
    """Whether any backward of the schedule is split into B (input gradient) and W (weights)."""
    return any(a.kind == "W" for acts in schedule for a in acts)


def split_backward_keys(actions: Iterable[Action]) -> set[tuple[int, int]]:
    """The (micro-batch, chunk) pairs of one stage whose "B" is the input-gradient part only."""
    return {(a.microbatch, a.chunk) for a in actions if a.kind == "W"}


def max_in_flight(actions: list[Action]) -> int:
    """Largest number of (micro-batch, chunk) forwards whose backward ("B") has not yet run.

    W passes do not count: by the module's memory rule the B frees the activations except the part
    the W keeps (see :func:`max_pending_weight_grads`).
    """
    live = peak = 0
    for a in actions:
        if a.kind == "F":
            live += 1
        elif a.kind == "B":
            live -= 1
        peak = max(peak, live)
    return peak


def max_pending_weight_grads(actions: list[Action]) -> int:
    """Largest number of split backwards whose W has not yet run (each keeps its W inputs alive)."""
    split = split_backward_keys(actions)
    live = peak = 0
    for a in actions:
        if a.kind == "B" and (a.microbatch, a.chunk) in split:
            live += 1
        elif a.kind == "W":
            live -= 1
        peak = max(peak, live)
    return peak
