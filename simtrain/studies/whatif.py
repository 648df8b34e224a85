"""What-ifs (``whatif``): the mode they run in, and what a perturbed step reports (issue 28 part 3).

A perturbation makes ranks of one stage unlike each other (one slow GPU, one slow NIC), which only full
mode simulates: symmetric mode hands a world of at most ``FULL_MODE_WORLD`` ranks to full mode and says
so in the notes; a larger one is refused, naming ``sim.mode`` (full mode there is the user's call; it
simulates one rank per class of alike ranks, ``simtrain.engine.merge``, so a slow GPU among 1,024 takes
seconds, but a perturbation that makes a class's members differ on the fabric, such as a slow link only
some of them cross, has it simulate every rank). ``simtrain.studies.simulate`` runs the step twice,
without and with the perturbation, in the same mode, and :func:`summary` is ``StepResult.whatif``: both step times, what the
perturbation cost, the critical rank (it ends last) and the bottleneck rank (it computes longest), each
with its GPU.
"""

from __future__ import annotations

from typing import Any

from simtrain.engine.records import TIE_REL_TOL, EngineResult
from simtrain.hardware.fabric.perturb import gpu_name, iter_names
from simtrain.spec.errors import ConfigError, problem
from simtrain.spec.whatif_spec import WhatIfSpec


def whatif_mode(spec: WhatIfSpec, mode: str, world_size: int, full_mode_world: int) -> tuple[str, str | None]:
    """(mode to simulate in, note or None) for a run with the perturbations ``spec``.

    Raises:
        ConfigError: symmetric mode asked for a world larger than ``full_mode_world`` ranks.
    """
    if mode == "full":
        return mode, None
    if world_size <= full_mode_world:
        return "full", (f"simulated every rank (full mode): the what-if ({'; '.join(iter_names(spec))}) makes ranks "
                        f"unlike their peers, which symmetric mode (one rank per stage) cannot show")
    raise ConfigError(problem("sim.mode", mode, f"full (--mode full): a whatif makes ranks unlike their peers, which "
                                                f"only full mode simulates, and symmetric mode hands over to full mode "
                                                f"only up to {full_mode_world} ranks (this run has {world_size}); "
                                                "full mode simulates each class of alike ranks once"))


def key_ranks(res: EngineResult) -> tuple[int, int]:
    """(critical rank, bottleneck rank) of an engine run. The critical rank ends last (the step's end;
    ``EngineResult.critical_rank``); the bottleneck rank is busy computing longest (compute and optimizer
    seconds), the lowest such rank within ``TIE_REL_TOL``. A slow GPU in data parallelism is both; in a
    pipeline the first stage ends last, waiting for the slow stage, which is the bottleneck."""
    busy = {r: sum(res.stats[r].busy.values()) for r in res.ranks}
    most = max(busy.values())
    return res.critical_rank(), min(r for r in res.ranks if busy[r] >= most - TIE_REL_TOL * most)


def summary(spec: WhatIfSpec, step_time_s: float, baseline_step_time_s: float, ranks: tuple[int, int],
            baseline_ranks: tuple[int, int], gpus_per_node: int, speeds: dict[int, float]) -> dict[str, Any]:
    """``StepResult.whatif``: the perturbations, both step times (seconds), the cost (seconds and % of the
    unperturbed step), the critical and bottleneck ranks (``key_ranks``) with their GPUs
    (``node{n}/gpu{l} (gpu{g})``; rank r runs on GPU r) and speed factors, and the unperturbed run's."""
    cost = step_time_s - baseline_step_time_s
    critical, bottleneck = ranks
    return {
        "perturbations": spec.model_dump(exclude_defaults=True),
        "step_time_s": step_time_s,
        "baseline_step_time_s": baseline_step_time_s,
        "cost_s": cost,
        "cost_pct": 100.0 * cost / baseline_step_time_s,
        "critical_rank": critical,
        "critical_gpu": gpu_name(critical, gpus_per_node),
        "critical_speed": speeds.get(critical, 1.0),
        "bottleneck_rank": bottleneck,
        "bottleneck_gpu": gpu_name(bottleneck, gpus_per_node),
        "bottleneck_speed": speeds.get(bottleneck, 1.0),
        "baseline_critical_rank": baseline_ranks[0],
        "baseline_bottleneck_rank": baseline_ranks[1],
    }


def summary_lines(w: dict[str, Any] | None) -> list[str]:
    """The what-if lines of the CLI summary (none without a what-if)."""
    if not w:
        return []
    return [
        f"  what-if       {w['step_time_s']:.4f} s vs {w['baseline_step_time_s']:.4f} s unperturbed: "
        f"{w['cost_s']:+.4f} s ({w['cost_pct']:+.2f} %)",
        f"  critical rank {w['critical_rank']} on {w['critical_gpu']} (speed {w['critical_speed']:g}x) ends "
        f"last; unperturbed: rank {w['baseline_critical_rank']}",
        f"  bottleneck    rank {w['bottleneck_rank']} on {w['bottleneck_gpu']} (speed {w['bottleneck_speed']:g}x) "
        f"computes longest; unperturbed: rank {w['baseline_bottleneck_rank']}",
    ]
