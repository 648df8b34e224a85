"""DualPipe and DualPipeV: two model chunks per rank, overlapped forward-and-backward pairs.

- DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2.1, Fig. 5, Table 2;
  deepseek-ai/DualPipe ``dualpipe/dualpipe.py``): bidirectional. Rank ``s`` holds chunk 0 = model
  stage ``s`` of the forward direction and chunk 1 = model stage ``p - 1 - s`` (which the reverse
  direction reaches at rank ``s``). Micro-batches ``0 .. m/2 - 1`` enter at rank 0 and use chunk 0,
  ``m/2 .. m - 1`` enter at rank ``p - 1`` and use chunk 1. The eight steps of the reference
  (warm-up forwards, F0F1, B1W1F1, the overlapped main loop F0&B1 / F1&B0, B1 F1&B0, B1B0, WB0, W).
- DualPipeV (the "cut-in-half" V-shape variant, deepseek-ai/DualPipe ``dualpipe/dualpipev.py``):
  the same steps on ``p`` ranks holding ``2p`` stages in a V: rank ``s`` holds chunk 0 = stage ``s``
  and chunk 1 = stage ``2p - 1 - s``; every micro-batch enters and leaves at rank 0.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from simtrain.plan.schedules.base import Action, Route, RouteShape, Schedule
from simtrain.spec.errors import Problem
from simtrain.spec.schedule_names import ScheduleKind


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


class _DualPipeBase(Schedule):
    """What DualPipe and DualPipeV share: two chunks per rank they place themselves, some backwards
    split, overlapped F&B pairs, and a steady state of a pair of micro-batches per rank from each
    direction (period ``2p``, at least ``2p`` micro-batches)."""

    chunks: ClassVar[int | None] = 2
    splits_backward: ClassVar[bool] = True
    overlaps_forward_backward: ClassVar[bool] = True

    def period(self, p: int) -> int:
        return max(p, 1) * 2

    def least_microbatches(self, p: int) -> int:
        return 2 * p

    def layout_problems(self, p: int, v: int, n_layers: int) -> list[Problem]:
        out = self.layer_problems(p, 1, n_layers)
        if v > 1:
            out.append(Problem("layout.vpp", f"{v}: {str(self.kind)} places two chunks per rank itself; set vpp=1"))
            out.append(Problem("layout.schedule", f"{str(self.kind)!r} cannot run vpp={v}; use interleaved_1f1b"))
        return out


class DualPipe(_DualPipeBase):
    """DualPipe: even ``p``; an even micro-batch count of at least ``2p``, half from each end."""

    kind: ClassVar[str] = ScheduleKind.DUALPIPE
    title: ClassVar[str] = "DualPipe"

    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        return dualpipe(p, m)

    def route(self, p: int, m: int, v: int = 1) -> Route:
        return Route(RouteShape.DUALPIPE, p, 2, m)

    def chunk_runs(self, m: int) -> int:
        return m // 2  # half the micro-batches go down each direction (chunk 0 or chunk 1)

    def microbatch_problems(self, p: int, m: int, path: str) -> list[Problem]:
        if p % 2 or m % 2 or m < 2 * p:
            # deepseek-ai/DualPipe dualpipe.py asserts: even ranks, even micro-batches, at least 2 x ranks
            return [Problem(path, f"DualPipe needs an even layout.pp (got {p}) and an even micro-batch count of "
                                  f"at least 2 x pp = {2 * p} (got {m})")]
        return []


class DualPipeV(_DualPipeBase):
    """DualPipeV: ``2p`` model stages in a V on ``p`` ranks; at least ``2p`` micro-batches."""

    kind: ClassVar[str] = ScheduleKind.DUALPIPEV
    title: ClassVar[str] = "DualPipeV"

    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        return dualpipev(p, m)

    def route(self, p: int, m: int, v: int = 1) -> Route:
        return Route(RouteShape.V, p, 2, m)

    def layer_problems(self, p: int, v: int, n_layers: int) -> list[Problem]:
        if p <= n_layers < 2 * p - 2:  # (more stages than layers is layout.pp's problem)
            # simtrain.lower.lowering.layers_by_position: a V of 2 x pp model stages, the first and last on rank 0
            # (which also holds the embedding and the head) give up layers first; any other stage without a
            # layer would leave the pipeline with an empty chunk
            return [Problem("layout.schedule", f"'dualpipev' places 2 x pp = {2 * p} model chunks in a V; "
                                               f"every chunk but the first and last needs a layer, so at least "
                                               f"2 x pp - 2 = {2 * p - 2} layers, model.n_layers="
                                               f"{n_layers}; lower layout.pp or use another schedule")]
        return []

    def microbatch_problems(self, p: int, m: int, path: str) -> list[Problem]:
        if m < 2 * p:  # deepseek-ai/DualPipe dualpipev.py asserts at least 2 x ranks micro-batches
            return [Problem(path, f"DualPipeV needs at least 2 x pp = {2 * p} micro-batches, got {m}")]
        return []
