"""What every simulated rank of a pipeline stage shares: tables the engine derives from the stage's program.

All ranks of a stage run one program, so these are made once per stage, not once per rank: full mode
simulates every rank, and a table per rank costs ranks x ops time and memory before the first event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from simtrain.engine.inline import Inline, inline_plan
from simtrain.lower.ops import CostedComputeOp, Op, OpKind, Program, Stream


@dataclass(frozen=True, slots=True)
class StageTables:
    """Per-stage tables of the engine (op indices are the program's)."""

    inline: Inline
    """The comm ops the compute stream runs itself (``simtrain.engine.inline``; empty without fast paths)."""
    need: frozenset[int]
    """Ops something waits for: they fire a done event (``needed_ops``)."""
    queues: tuple[tuple[Stream, list[Op]], ...]
    """Each stream's ops in issue order, less the in-line ones (a stream without ops has an empty list)."""
    flops: tuple[float, ...]
    """Hardware FLOPs of each compute-stream op, in stream order (``ComputeOp.flops`` sums its kernels)."""
    sent: frozenset[int]
    """Ops (sends) whose start time a receiver on another stage reads to split its wait (bubble vs pp)."""

    @classmethod
    def of(cls, prog: Program, programs: Sequence[Program], fast_paths: bool,
           read: dict[int, frozenset[int]] | None = None) -> StageTables:
        """The tables of ``prog``, one of ``programs`` (all stages': receivers point at its sends);
        ``read``: ``sends_read(programs)``, when the caller has it (one pass for all stages)."""
        inline = inline_plan(prog.ops) if fast_paths else {}
        moved = {op.idx for pre, _ in inline.values() for op in pre}
        by_stream: dict[Stream, list[Op]] = {s: [] for s in Stream}
        for op in prog.ops:  # one pass, issue order kept (``Program.stream_ops`` per stream is one pass each)
            if op.idx not in moved:
                by_stream[op.stream].append(op)
        queues = tuple(by_stream.items())
        # an op's FLOPs sum its kernels: once per kernel tuple (a layer's tuple recurs every micro-batch)
        sums: dict[int, tuple[tuple[object, ...], float]] = {}
        flops_of = []
        for o in by_stream[Stream.COMPUTE]:
            kernels = cast(CostedComputeOp, o).kernels
            hit = sums.get(id(kernels))
            if hit is None or hit[0] is not kernels:
                hit = sums[id(kernels)] = (kernels, cast(CostedComputeOp, o).flops)
            flops_of.append(hit[1])
        flops = tuple(flops_of)
        sent = (read if read is not None else sends_read(programs)).get(prog.stage, frozenset())
        return cls(inline, frozenset(needed_ops(prog, inline)), queues, flops, sent)


def sends_read(programs: Sequence[Program]) -> dict[int, frozenset[int]]:
    """Per stage: its ops (sends) that a receiver on another stage names in ``remote``."""
    read: dict[int, set[int]] = {}
    for q in programs:
        for o in q.ops:
            if o.remote is not None:
                read.setdefault(o.remote[0], set()).add(o.remote[1])
    return {stage: frozenset(ops) for stage, ops in read.items()}


def needed_ops(prog: Program, inline: Inline) -> set[int]:
    """Ops something waits for (their done events): deps, sends (a receiver waits), less what the
    compute stream's in-line runs settle by order."""
    moved = {op.idx for pre, _ in inline.values() for op in pre}
    need = {d for op in prog.ops if op.idx not in moved and op.idx not in inline for d in op.deps}
    need.update(d for _, rest in inline.values() for d in rest)
    need.update(op.idx for op in prog.ops if op.kind == OpKind.SEND)
    return need
