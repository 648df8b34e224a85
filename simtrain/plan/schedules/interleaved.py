"""Interleaved 1F1B: ``v`` model chunks per stage (virtual pipeline stages).

Narayanan et al. 2021 sec. 2.2.2; Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``:
``get_schedule_table``, ``get_pp_rank_microbatches``, ``forward_backward_pipelining_with_interleaving``.
Micro-batches advance through the chunks in groups of ``microbatch_group_size_per_vp_stage`` (``p``
by default); warm-up is ``(p - s - 1) * 2 + (v - 1) * group`` virtual micro-batches.
"""

from __future__ import annotations

from typing import ClassVar

from simtrain.plan.schedules.base import Action, Route, RouteShape, Schedule
from simtrain.spec.errors import Problem
from simtrain.spec.schedule_names import ScheduleKind

#: The interleaved memory peak is reached within this many x pp micro-batches: the warm-up is
#: ``(p - s - 1) * 2 + (v - 1) * p`` virtual micro-batches, so 4 x p micro-batches cover it and one
#: steady period (tested against the engine's closed form on full schedules).
PEAK_MICROBATCHES_PER_STAGE = 4


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


class Interleaved1F1B(Schedule):
    """Interleaved 1F1B: ``layout.vpp > 1`` chunks per stage, at least ``p`` micro-batches."""

    kind: ClassVar[str] = ScheduleKind.INTERLEAVED_1F1B
    title: ClassVar[str] = "interleaved 1F1B"
    chunks: ClassVar[int | None] = None
    uniform_bubble: ClassVar[bool] = True

    def actions(self, p: int, m: int, v: int = 1) -> list[list[Action]]:
        return interleaved_1f1b(p, m, v)

    def route(self, p: int, m: int, v: int = 1) -> Route:
        return Route(RouteShape.INTERLEAVED, p, v, m)

    def peak_microbatches(self, p: int, m: int) -> int:
        return min(m, PEAK_MICROBATCHES_PER_STAGE * p)

    def layout_problems(self, p: int, v: int, n_layers: int) -> list[Problem]:
        if v == 1:
            return [Problem("layout.schedule", "interleaved_1f1b needs layout.vpp > 1")]
        return self.layer_problems(p, v, n_layers)

    def layer_problems(self, p: int, v: int, n_layers: int) -> list[Problem]:
        if n_layers < p * v - 2:
            return [Problem("layout.vpp", f"{v}: pp x vpp = {p * v} model chunks need at least pp x vpp - 2 "
                                          f"layers (first and last may hold only the embedding and head), "
                                          f"model.n_layers={n_layers}")]
        return []

    def microbatch_problems(self, p: int, m: int, path: str) -> list[Problem]:
        if m < p:  # Megatron-core get_schedule_table: m need not be a multiple of p, but at least p
            return [Problem(path, f"interleaved 1F1B needs at least layout.pp={p} micro-batches, got {m}")]
        return []
