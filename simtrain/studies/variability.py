"""GPU-to-GPU speed variability (``sim.variability``): seeded draws of every GPU's speed, and what they report.

Each draw gives every GPU of the world a compute speed factor from a normal distribution of mean 1 and
standard deviation ``gpu_speed_cv`` (floored at ``SPEED_FLOOR``); the step is simulated once per draw and
``StepResult.variability`` holds the step time's percentiles over the draws next to the nominal step.

How a draw reaches the engine:

- full mode: every rank runs at its GPU's factor (rank r runs on GPU r); the collectives' rendezvous make
  its peers wait for it, as in ``whatif.slow_gpus``;
- symmetric mode (one representative rank per stage): the representative runs at the slowest factor among
  its stage's GPUs. A stage's ranks meet at every tensor-parallel collective and at the data-parallel
  gradient reduction that ends each step, so the stage finishes when its slowest member does; each stage
  taking its own slowest member over-counts a little where those members sit in different pipeline
  replicas (1F1B runs at the slowest stage's pace either way). Full mode is exact.

The draws come from ``numpy.random.default_rng(sim.seed)``: the same seed gives the same numbers, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simtrain.plan.layout import RankGrid
from simtrain.spec.config import RunConfig
from simtrain.spec.variability_spec import VariabilitySpec

#: Smallest speed factor a draw may give a GPU: the normal's tail below it (more than 4.75 standard
#: deviations at the largest accepted spread) would stall a GPU outright [bound, not a measurement].
SPEED_FLOOR = 0.05
#: Percentiles of the step time reported over the draws.
PERCENTILES = (10, 50, 90)


def nominal(run: RunConfig) -> RunConfig:
    """``run`` without ``sim.variability``: the whole-run and search studies rank and time by the nominal step,
    so they simulate no draws (each would cost a simulation, outside the search's budget)."""
    if run.sim.variability is None:
        return run
    return run.model_copy(update={"sim": run.sim.model_copy(update={"variability": None})})


def draw_speeds(rng: np.random.Generator, world: int, cv: float) -> np.ndarray:
    """Speed factors (dimensionless, mean 1, standard deviation ``cv``) of GPUs 0..``world``-1, one draw."""
    return np.maximum(1.0 + cv * rng.standard_normal(world), SPEED_FLOOR)


def rank_speeds(grid: RankGrid, speeds: np.ndarray, symmetric: bool, representatives: list[list[int]]) -> dict[int, float]:
    """Engine speed per simulated rank from one draw of per-GPU ``speeds`` (module docstring): every rank's
    own in full mode; in symmetric mode each stage's representatives (one list per role, one rank per stage)
    take the slowest factor of their stage."""
    if not symmetric:
        return {r: float(s) for r, s in enumerate(speeds)}
    pp = grid.layout.pp
    stage = (np.arange(grid.world_size) // grid.stride("pp")) % pp
    slowest = [float(speeds[stage == s].min()) for s in range(pp)]
    return {rep: slowest[s] for reps in representatives for s, rep in enumerate(reps)}


def summary(spec: VariabilitySpec, seed: int, nominal_s: float, times_s: list[float],
            slowest: list[float]) -> dict[str, Any]:
    """``StepResult.variability``: the spread asked, the draws, the step time's percentiles (seconds) and the
    slowest GPU's speed factor (median over the draws)."""
    t = np.asarray(times_s, dtype=float)
    pct = {f"p{p}": float(np.percentile(t, p)) for p in PERCENTILES}
    return {"gpu_speed_cv": spec.gpu_speed_cv, "samples": spec.samples, "seed": seed,
            "nominal_step_time_s": nominal_s,
            "step_time_s": {**pct, "mean": float(t.mean()), "min": float(t.min()), "max": float(t.max())},
            "slowest_gpu_speed_p50": float(np.median(slowest))}


def summary_lines(v: dict[str, Any] | None) -> list[str]:
    """The variability lines of ``simtrain simulate``'s summary (none without ``sim.variability``)."""
    if not v:
        return []
    st, nominal = v["step_time_s"], v["nominal_step_time_s"]
    return [f"  variability   GPU speed CV {100 * v['gpu_speed_cv']:.1f} %, {v['samples']} draws (seed {v['seed']}): "
            f"step p10 / p50 / p90 {st['p10']:.4f} / {st['p50']:.4f} / {st['p90']:.4f} s "
            f"({100 * (st['p50'] / nominal - 1):+.2f} % at p50 over the nominal {nominal:.4f} s; "
            f"slowest GPU at {v['slowest_gpu_speed_p50']:.3f}x, median over draws)"]
