"""Routed load of each expert and each EP rank: balanced, skewed (a hot expert) or capped by capacity.

The routed-expert kernels of a rank take time in proportion to the tokens its experts receive. With
balanced routing every expert receives top_k x tokens / experts copies (factor 1). With skewed routing
one expert (expert 0, on EP rank 0) receives ``hot`` x the mean and the others share the rest
equally; a capacity factor c caps each expert at c x the mean, dropping the overflow (GShard, Lepikhin
et al. 2020 sec. 2.2; Switch Transformer, Fedus et al. 2022 sec. 2.2). A rank's factor is the mean load
of its experts; EP synchronises at every dispatch, so the hottest rank sets the pace (the report's
"slowest rank"), which symmetric mode charges to every rank and full mode to that rank alone.
"""

from __future__ import annotations

from simtrain.config import RunConfig
from simtrain.layout import RankGrid


def expert_loads(n_experts: int, routing: str, hot: float, capacity: float | None) -> list[float]:
    """Load of every expert as a multiple of the mean load (after any capacity drop)."""
    if routing == "balanced" or n_experts == 1:
        loads = [1.0] * n_experts
    else:
        hot = min(hot, float(n_experts))
        rest = (n_experts - hot) / (n_experts - 1)
        loads = [hot] + [rest] * (n_experts - 1)
    if capacity is not None:
        loads = [min(x, capacity) for x in loads]
    return loads


def rank_load_factors(run: RunConfig, grid: RankGrid, ranks: list[int]) -> dict[int, float]:
    """Routed-expert time factor of each rank in ``ranks`` (1.0 without MoE or with balanced routing)."""
    if run.model.moe is None:
        return {r: 1.0 for r in ranks}
    per_ep_rank = expert_loads_by_rank(run)
    return {r: per_ep_rank[grid.group("ep", r).index(r)] for r in ranks}


def symmetric_load_factors(run: RunConfig, representatives: list[int]) -> dict[int, float]:
    """Symmetric mode: each stage's representative runs at the hottest EP rank's pace."""
    worst = max(expert_loads_by_rank(run))
    return {r: worst for r in representatives}


def expert_loads_by_rank(run: RunConfig) -> list[float]:
    """Load factor of each EP rank (index = position in its EP group)."""
    moe = run.model.moe
    if moe is None:
        return [1.0]
    tr = run.train
    loads = expert_loads(moe.n_experts, tr.moe_routing, tr.moe_hot_expert_load, tr.moe_capacity_factor)
    local = moe.n_experts // run.layout.ep
    return [sum(loads[i * local:(i + 1) * local]) / local for i in range(run.layout.ep)]
