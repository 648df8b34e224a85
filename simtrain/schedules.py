"""Pipeline schedules as data.

A schedule is a pure function returning, for every pipeline stage, the ordered list of
``Action(kind, microbatch, chunk)`` that stage executes; the engine runs whatever list it is given.
``kind`` is "F" (forward) or "B" (backward). ``chunk`` is the virtual stage (model chunk) index on
that pipeline rank (always 0 without interleaving).

- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 sec. 2.2): ``p - s - 1`` warm-up forwards, then
  alternate one forward and one backward, then drain the backwards.
- Interleaved 1F1B (Narayanan et al. 2021 sec. 2.2.2; Megatron-LM
  ``megatron/core/pipeline_parallel/schedules.py``,
  ``forward_backward_pipelining_with_interleaving``): micro-batches advance through the chunks in
  groups of ``p``; warm-up is ``(p - s - 1) * 2 + (v - 1) * p`` virtual micro-batches.
"""

from __future__ import annotations

from typing import NamedTuple


class Action(NamedTuple):
    """One unit of pipeline work: forward or backward of one micro-batch on one model chunk."""

    kind: str
    microbatch: int
    chunk: int


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


def _virtual(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """Micro-batch and chunk of the k-th virtual micro-batch of a stage (Megatron's ordering)."""
    group = k // (p * v)
    chunk = (k // p) % v
    if not forward:
        chunk = v - 1 - chunk
    return group * p + k % p, chunk


def interleaved_1f1b(p: int, m: int, v: int) -> list[list[Action]]:
    """Interleaved 1F1B with ``v`` chunks per stage; requires ``m`` to be a multiple of ``p``."""
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple of p={p}")
    total = m * v
    out = []
    for s in range(p):
        warm = min((p - s - 1) * 2 + (v - 1) * p, total)
        acts = [Action("F", *_virtual(k, p, v, True)) for k in range(warm)]
        f, b = warm, 0
        while f < total:
            acts.append(Action("F", *_virtual(f, p, v, True)))
            acts.append(Action("B", *_virtual(b, p, v, False)))
            f, b = f + 1, b + 1
        acts += [Action("B", *_virtual(k, p, v, False)) for k in range(b, total)]
        out.append(acts)
    return out


def build_schedule(kind: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Dispatch by schedule name ("gpipe", "1f1b", "interleaved_1f1b")."""
    if kind == "gpipe":
        return gpipe(p, m)
    if kind == "1f1b":
        return one_f_one_b(p, m)
    if kind == "interleaved_1f1b":
        return interleaved_1f1b(p, m, v)
    raise ValueError(f"unknown schedule {kind!r}")


def max_in_flight(actions: list[Action]) -> int:
    """Largest number of (micro-batch, chunk) forwards whose backward has not yet run."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak
