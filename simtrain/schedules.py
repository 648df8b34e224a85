"""Pipeline schedules as data, and a schedule-level timing evaluator.

A schedule is a pure function returning, for every pipeline stage (rank), the ordered list of
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

Schedules
---------
- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 sec. 2.2): ``p - s - 1`` warm-up forwards, then
  alternate one forward and one backward, then drain the backwards.
- Interleaved 1F1B (Narayanan et al. 2021 sec. 2.2.2; Megatron-LM
  ``megatron/core/pipeline_parallel/schedules.py``: ``get_schedule_table``,
  ``get_pp_rank_microbatches``, ``forward_backward_pipelining_with_interleaving``): micro-batches
  advance through the chunks in groups of ``microbatch_group_size_per_vp_stage`` (``p`` by
  default); warm-up is ``(p - s - 1) * 2 + (v - 1) * group`` virtual micro-batches.
- ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, sec. 3.1 and
  Fig. 3; sail-sg/zero-bubble-pipeline-parallelism): 1F1B's order and memory with the backward split
  into B and W; stage ``s`` postpones its first ``s`` W passes into the drain, where they fill the
  bubble 1F1B leaves there.
- DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2.1, Fig. 5, Table 2;
  deepseek-ai/DualPipe ``dualpipe/dualpipe.py``): bidirectional. Rank ``s`` holds chunk 0 = model
  stage ``s`` of the forward direction and chunk 1 = model stage ``p - 1 - s`` (which the reverse
  direction reaches at rank ``s``). Micro-batches ``0 .. m/2 - 1`` enter at rank 0 and use chunk 0,
  ``m/2 .. m - 1`` enter at rank ``p - 1`` and use chunk 1. The eight steps of the reference
  (warm-up forwards, F0F1, B1W1F1, the overlapped main loop F0&B1 / F1&B0, B1 F1&B0, B1B0, WB0, W).
- DualPipeV (the "cut-in-half" V-shape variant, deepseek-ai/DualPipe ``dualpipe/dualpipev.py``):
  the same steps on ``p`` ranks holding ``2p`` stages in a V: rank ``s`` holds chunk 0 = stage ``s``
  and chunk 1 = stage ``2p - 1 - s``; every micro-batch enters and leaves at rank 0.

Timing
------
:func:`makespan` executes a schedule at the level of whole actions (no simpy): each stage runs its
list in order, an action starts when its stage is free and its cross-stage inputs have arrived,
and the result holds each action's start and end, each stage's busy and idle (bubble) time.
:func:`validate_schedule` checks completeness and order; :func:`makespan` also reports deadlocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "dualpipe", "dualpipev")
"""Schedule names :func:`build_schedule` accepts."""


class Action(NamedTuple):
    """One unit of pipeline work on one model chunk of one micro-batch (see the module docstring)."""

    kind: str
    microbatch: int
    chunk: int
    overlap_with_next: bool = False


class ScheduleError(ValueError):
    """A schedule that is incomplete, out of order, or deadlocks."""


# -- routes: where each micro-batch goes ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Route:
    """The forward path of every micro-batch through ``(stage, chunk)`` pairs.

    ``shape`` is ``"interleaved"`` (chunk-major: stages ``0..p-1`` of chunk 0, then of chunk 1, ...,
    Megatron's virtual stages ``chunk * p + stage``; GPipe, 1F1B and ZB-H1 are ``v = 1``),
    ``"dualpipe"`` (micro-batches below ``m // 2`` go ranks ``0 -> p-1`` on chunk 0, the others
    ranks ``p-1 -> 0`` on chunk 1) or ``"v"`` (ranks ``0 -> p-1`` on chunk 0 then ``p-1 -> 0`` on
    chunk 1). Backward passes walk the path in reverse.
    """

    shape: str
    p: int
    v: int = 1
    m: int = 0

    @property
    def length(self) -> int:
        """Number of hops (model stages) on a micro-batch's path."""
        return self.p if self.shape == "dualpipe" else self.p * self.v

    def at(self, microbatch: int, position: int) -> tuple[int, int]:
        """``(stage, chunk)`` of the ``position``-th model stage on a micro-batch's path."""
        p = self.p
        if self.shape == "interleaved":
            return position % p, position // p
        if self.shape == "dualpipe":
            return (position, 0) if microbatch < self.m // 2 else (p - 1 - position, 1)
        return (position, 0) if position < p else (2 * p - 1 - position, 1)

    def position(self, microbatch: int, stage: int, chunk: int) -> int:
        """Index of ``(stage, chunk)`` on a micro-batch's path (its model stage)."""
        p = self.p
        if self.shape == "interleaved":
            return chunk * p + stage
        if self.shape == "dualpipe":
            return stage if chunk == 0 else p - 1 - stage
        return stage if chunk == 0 else 2 * p - 1 - stage

    def path(self, microbatch: int) -> list[tuple[int, int]]:
        """The whole forward path of a micro-batch."""
        return [self.at(microbatch, k) for k in range(self.length)]


def schedule_route(kind: str, p: int, m: int, v: int = 1) -> Route:
    """The :class:`Route` of a schedule built by :func:`build_schedule` with the same arguments."""
    if kind == "dualpipe":
        return Route("dualpipe", p, 2, m)
    if kind == "dualpipev":
        return Route("v", p, 2, m)
    if kind in SCHEDULES:
        return Route("interleaved", p, v if kind == "interleaved_1f1b" else 1, m)
    raise ValueError(f"unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")


# -- GPipe, 1F1B, interleaved 1F1B -------------------------------------------------------------
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


def interleaved_group_size(p: int, m: int) -> int:
    """Default micro-batch group size for interleaved 1F1B: ``p`` when ``p`` divides ``m``.

    Otherwise the smallest ``g`` in ``[p, m]`` that Megatron-LM accepts for
    ``microbatch_group_size_per_vp_stage``: the last group (``m % g`` micro-batches) must be empty
    or hold at least ``p`` (``forward_backward_pipelining_with_interleaving``'s checks), else it
    leaves dependency bubbles. ``g = m`` (one group) always qualifies.
    """
    if m < p:
        raise ValueError(f"interleaved 1F1B needs at least p={p} micro-batches, got {m} "
                         "(Megatron-LM: microbatch_group_size_per_vp_stage must lie in [p, m])")
    return next(g for g in range(p, m + 1) if m % g == 0 or m % g >= p)


def _interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """Megatron's ``get_schedule_table``: the (micro-batch, chunk) of each virtual micro-batch.

    Micro-batches go in groups of ``group`` (the last one holds what is left); within a group every
    micro-batch runs chunk 0, then every one runs chunk 1, and so on.
    """
    table = []
    for start in range(0, m, group):
        members = range(start, min(start + group, m))
        table += [(i, c) for c in range(v) for i in members]
    return table


def interleaved_1f1b(p: int, m: int, v: int, group_size: int | None = None) -> list[list[Action]]:
    """Interleaved 1F1B with ``v`` chunks per stage (Megatron-LM's order).

    ``group_size`` is Megatron's ``microbatch_group_size_per_vp_stage`` (default
    :func:`interleaved_group_size`: ``p`` when ``m % p == 0``, the original schedule). It must lie in
    ``[p, m]`` and leave a last group of 0 or at least ``p`` micro-batches. The backward of virtual
    micro-batch ``k`` is the forward table's entry ``k`` with its chunk mirrored (``v - 1 - c``).
    """
    group = interleaved_group_size(p, m) if group_size is None else group_size
    if not p <= group <= m:
        raise ValueError(f"interleaved 1F1B group size {group} must lie in [p={p}, m={m}]")
    if 0 < m % group < p:
        raise ValueError(f"interleaved 1F1B: the last micro-batch group ({m % group} = {m} mod {group}) "
                         f"must be empty or hold at least p={p} micro-batches; use a multiple of p or "
                         "another group size")
    table = _interleaved_table(m, v, group)
    total = m * v
    out = []
    for s in range(p):
        warm = min((p - s - 1) * 2 + (v - 1) * group, total)
        fwd = [Action("F", i, c) for i, c in table]
        bwd = [Action("B", i, v - 1 - c) for i, c in table]
        out.append(fwd[:warm] + _alternate(fwd[warm:], bwd[: total - warm]) + bwd[total - warm:])
    return out


def _alternate(first: list[Action], second: list[Action]) -> list[Action]:
    """``first[0], second[0], first[1], second[1], ...`` (equal lengths)."""
    return [a for pair in zip(first, second, strict=True) for a in pair]


# -- ZB-H1 ---------------------------------------------------------------------------------------
def zb_h1(p: int, m: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2023 sec. 3.1, Fig. 3): 1F1B with the backward split into B and W.

    Stage ``s`` runs 1F1B's ``p - s - 1`` warm-up forwards and then F/B pairs in 1F1B's order, so
    the forwards in flight (and the activation peak) are 1F1B's; W passes follow their B, except that
    the first ``s`` of them are postponed: each stage's W lags its B by ``s`` steady steps and the
    last ``s`` W passes run after the last B, filling the drain bubble (the "later-starting W
    passes" of sec. 3.1; PyTorch ``torch.distributed.pipelining`` builds its zero-bubble ranks the
    same way). With ``W <= F`` and ``W <= B`` (B the input-gradient backward) the bubble is
    ``(p - 1)(F + B - W)``, against 1F1B's ``(p - 1)(F + B + W)``: a third of it when
    ``F = B = W`` (Qi et al.'s setting). DeepSeek-V3's Table 2 writes the same
    ``(PP - 1)(F + B - 2W)`` with B the full backward.
    """
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        acts = [Action("F", i, 0) for i in range(warm)]
        lag = min(s, m)
        w_next = 0
        for b in range(m):
            if warm + b < m:
                acts.append(Action("F", warm + b, 0))
            acts.append(Action("B", b, 0))
            if b >= lag:
                acts.append(Action("W", w_next, 0))
                w_next += 1
        acts += [Action("W", i, 0) for i in range(w_next, m)]
        out.append(acts)
    return out


# -- DualPipe and DualPipeV ----------------------------------------------------------------------
class _PhaseOp(NamedTuple):
    """One op of the DualPipe step program, on a phase (0 or 1) rather than a concrete chunk."""

    kind: str
    phase: int = 0
    split: bool = False
    overlap_with_next: bool = False


def _dualpipe_program(half: int, rank: int, chunks: int) -> list[_PhaseOp]:
    """The eight steps of deepseek-ai/DualPipe's ``step()`` for one rank, as phase ops.

    ``half`` is the number of ranks per direction (DualPipe: ``p / 2``; DualPipeV: ``p``), ``rank``
    the rank's index in its half (DualPipe: ``min(s, p - 1 - s)``), ``chunks`` the micro-batches per
    direction (DualPipe: ``m / 2``; DualPipeV: ``m``). Phase 0 is the direction the rank meets first.
    A ``split`` B is a zero-bubble input-gradient backward whose W is queued (FIFO, as the
    reference's ``WeightGradStore``); the others are full backwards.
    """
    f0, f1 = _PhaseOp("F", 0), _PhaseOp("F", 1)
    f0_with_b1, f1_with_b0 = _PhaseOp("F", 0, overlap_with_next=True), _PhaseOp("F", 1, overlap_with_next=True)
    b0, b1, w = _PhaseOp("B", 0), _PhaseOp("B", 1), _PhaseOp("W")
    b0_split, b1_split = _PhaseOp("B", 0, split=True), _PhaseOp("B", 1, split=True)
    inner = half - rank - 1
    ops = [f0] * (2 * inner)                                        # step 1: nF0
    ops += [f0, f1] * (rank + 1)                                    # step 2: nF0F1
    ops += [b1_split, w, f1] * inner                                # step 3: nB1W1F1 (zero bubble)
    for i in range(chunks - 2 * half + rank + 1):                   # step 4 (main): nF0B1F1B0
        # the middle ranks do not overlap the first pair, "to further reduce bubble size"
        ops += [f0, b1] if i == 0 and rank == half - 1 else [f0_with_b1, b1]
        ops += [f1_with_b0, b0]
    ops += [b1, f1_with_b0, b0] * inner                             # step 5: nB1F1B0
    for i in range(rank + 1):                                       # step 6: nB1B0, second half split
        split1 = i > (rank + 1) // 2 or (i == (rank + 1) // 2 and rank % 2 == 1)
        split0 = i >= (rank + 1) // 2
        ops += [b1_split if split1 else b1, b0_split if split0 else b0]
    ops += [w, b0_split] * inner                                    # step 7: nWB0 (zero bubble)
    ops += [w] * (rank + 1)                                         # step 8: nW
    return ops


def _bind_program(ops: list[_PhaseOp], chunk_of_phase: tuple[int, int],
                  first_mb: tuple[int, int]) -> list[Action]:
    """Give each phase op its chunk and micro-batch.

    Forwards and backwards of a chunk take that chunk's micro-batches in order (``first_mb[chunk]``,
    then the next, ...); each W takes the oldest queued split backward.
    """
    next_f, next_b = list(first_mb), list(first_mb)
    queued: list[tuple[int, int]] = []
    out = []
    for op in ops:
        if op.kind == "W":
            mb, chunk = queued.pop(0)
            out.append(Action("W", mb, chunk))
            continue
        chunk = chunk_of_phase[op.phase]
        counter = next_f if op.kind == "F" else next_b
        mb = counter[chunk]
        counter[chunk] += 1
        if op.split:
            queued.append((mb, chunk))
        out.append(Action(op.kind, mb, chunk, op.overlap_with_next))
    return out


def dualpipe(p: int, m: int) -> list[list[Action]]:
    """DualPipe (DeepSeek-V3 sec. 3.2.1; deepseek-ai/DualPipe ``dualpipe/dualpipe.py``).

    Requires ``p`` even and ``m`` even with ``m >= 2p`` (the reference's assertions: ``num_ranks % 2
    == 0``, ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``). Rank ``s`` and rank
    ``p - 1 - s`` run the same program mirrored: on the first half phase 0 is the forward direction
    (chunk 0), on the second half it is the reverse direction (chunk 1). Every rank peaks at
    ``p + 1`` forwards in flight (Table 2's activation column). When F equals the input-gradient B
    and W <= F, the idlest (middle) ranks idle exactly ``(p/2 - 1)(F&B + B_full - 3W)``, Table 2's
    bubble with B the full backward (checked by :func:`makespan` in the tests).
    """
    if p < 2 or p % 2:
        raise ValueError(f"DualPipe needs an even number of pipeline stages, got p={p}")
    if m % 2 or m < 2 * p:
        raise ValueError(f"DualPipe needs an even micro-batch count of at least 2p={2 * p} "
                         f"(half enter from each end), got m={m}")
    half = p // 2
    out = []
    for s in range(p):
        second = s >= half
        ops = _dualpipe_program(half, min(s, p - 1 - s), m // 2)
        out.append(_bind_program(ops, (1, 0) if second else (0, 1), (0, m // 2)))
    return out


def dualpipev(p: int, m: int) -> list[list[Action]]:
    """DualPipeV, DualPipe "cut in half" (deepseek-ai/DualPipe ``dualpipe/dualpipev.py``).

    ``p`` ranks hold ``2p`` model stages in a V (rank ``s``: chunk 0 = stage ``s``, chunk 1 = stage
    ``2p - 1 - s``); all ``m`` micro-batches enter and finish at rank 0. Requires ``m >= 2p``.
    """
    if p < 1:
        raise ValueError(f"DualPipeV needs p >= 1, got {p}")
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least 2p={2 * p} micro-batches, got m={m}")
    return [_bind_program(_dualpipe_program(p, s, m), (0, 1), (0, 0)) for s in range(p)]


# -- dispatch and memory -------------------------------------------------------------------------
def build_schedule(kind: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Dispatch by schedule name (one of :data:`SCHEDULES`)."""
    if kind == "gpipe":
        return gpipe(p, m)
    if kind == "1f1b":
        return one_f_one_b(p, m)
    if kind == "interleaved_1f1b":
        return interleaved_1f1b(p, m, v)
    if kind == "zb_h1":
        return zb_h1(p, m)
    if kind == "dualpipe":
        return dualpipe(p, m)
    if kind == "dualpipev":
        return dualpipev(p, m)
    raise ValueError(f"unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")


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


# -- validation ----------------------------------------------------------------------------------
def validate_schedule(schedule: Sequence[Sequence[Action]], route: Route | None = None) -> None:
    """Raise :class:`ScheduleError` unless the schedule is complete and ordered.

    Every stage holds, for every micro-batch whose path visits it (``route``, default the
    chunk-major interleaved route with ``v`` = the largest chunk + 1), exactly one F and one B per
    visited chunk and at most one W, in the order F, B, W; an ``overlap_with_next`` F is followed by
    a B of another micro-batch. Micro-batches are numbered ``0 .. m - 1``. Deadlocks are found by
    :func:`makespan`.
    """
    route = route or _default_route(schedule)
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
            out.append(f"stage {s}: {_name(a)} appears twice (#{pos[key]} and #{n})")
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


def _name(a: Action) -> str:
    return f"{a.kind}(mb={a.microbatch}, chunk={a.chunk})"


def _default_route(schedule: Sequence[Sequence[Action]]) -> Route:
    v = 1 + max((a.chunk for acts in schedule for a in acts), default=0)
    return Route("interleaved", len(schedule), v)


# -- timing evaluator ----------------------------------------------------------------------------
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
    route = route or _default_route(schedule)
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

    def execute(self) -> None:
        ready = list(range(self.p))
        while ready:
            ready += self._advance(ready.pop())
        if any(self.next_unit[s] < len(self.units[s]) for s in range(self.p)):
            raise ScheduleError("schedule deadlocks: " + "; ".join(
                f"stage {s} waits at {_name(a)} for {k[0]}(mb={k[1]}, chunk={k[3]}) on stage {k[2]}"
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
