"""Routed load of each expert and each EP rank: balanced, skewed (a hot expert) or capped by capacity.

The routed-expert kernels of a rank take time in proportion to the tokens its experts receive. With
balanced routing every expert receives top_k x tokens / experts copies (factor 1). With skewed routing
one expert (expert 0, on EP rank 0) receives ``hot`` x the mean and the others share the rest
equally; a capacity factor c caps each expert at c x the mean, dropping the overflow (GShard, Lepikhin
et al. 2020 sec. 2.2; Switch Transformer, Fedus et al. 2022 sec. 2.2). A rank's factor is the mean load
of its experts; EP synchronises at every dispatch, so the hottest rank sets the pace (the report's
"slowest rank"), which symmetric mode charges to every rank and full mode to that rank alone.

The busiest rank also receives that many more token copies: the dispatch all-to-all finishes when its
inbound link has moved them, the combine when its outbound link has sent them back (an all-to-all is as
slow as its most loaded link), and its experts keep that many more activations for backward. So
``worst_rank_load`` scales the EP all-to-alls (and expert-TP gathers) of every rank and the routed
experts' activation memory of the reported peak (the busiest rank's).
"""

from __future__ import annotations

from simtrain.plan.layout import RankGrid
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.spec.model import ModelSpec


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
    per_ep_rank = ep_rank_loads(run.model, run.train, run.layout)
    return {r: per_ep_rank[grid.group("ep", r).index(r)] for r in ranks}


def symmetric_load_factors(run: RunConfig, representatives: list[int]) -> dict[int, float]:
    """Symmetric mode: each stage's representative runs at the hottest EP rank's pace."""
    worst = worst_rank_load(run.model, run.train, run.layout)
    return {r: worst for r in representatives}


def ep_rank_loads(model: ModelSpec, train: TrainConfig, layout: LayoutConfig) -> list[float]:
    """Load factor of each EP rank (index = position in its EP group): the mean load of its local
    experts ([1.0] without MoE)."""
    moe = model.moe
    if moe is None:
        return [1.0]
    loads = expert_loads(moe.n_experts, train.moe_routing, train.moe_hot_expert_load, train.moe_capacity_factor)
    local = moe.n_experts // layout.ep
    return [sum(loads[i * local:(i + 1) * local]) / local for i in range(layout.ep)]


def worst_rank_load(model: ModelSpec, train: TrainConfig, layout: LayoutConfig) -> float:
    """Routed token copies the busiest EP rank receives, as a multiple of balanced routing (1.0 without
    MoE, with balanced routing, or when a capacity factor caps every expert at the mean)."""
    return max(ep_rank_loads(model, train, layout))
