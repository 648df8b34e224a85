"""Whole training runs: the batch schedule simulated phase by phase -> time to train, GPU-hours, cost.

``simulate_run(config)`` resolves the ``run:`` section into phases (``simtrain.spec.batch``), simulates
one optimizer step of each *distinct* phase configuration (phases with the same resolved config
share one simulation, through a cache keyed by the config's JSON), and adds them up:

    time to train = sum over phases of steps x step time
    GPU-hours     = time to train x GPUs / 3600
    cost          = GPU-hours x price per GPU-hour

Every step of a phase is taken to last as long as the simulated one (the simulation is
deterministic and has no noise); evaluation is not counted. With ``run.failures`` or ``run.checkpoint``
the result also has the goodput under failures, checkpoints and restarts (``simtrain.studies.goodput``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from simtrain.engine.results import StepResult
from simtrain.plan.load import load_config
from simtrain.plan.phases import Phase, resolve_phases
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem
from simtrain.studies.goodput import GoodputInputs, GoodputResult, build_inputs, check_spec, render_goodput
from simtrain.studies.goodput import goodput as goodput_of
from simtrain.studies.uncertainty import ErrorBand

S_PER_HOUR = 3600.0
S_PER_DAY = 86400.0

SimulateFn = Callable[[RunConfig], StepResult]


@dataclass(slots=True)
class PhaseResult:
    """One phase of a run: its batch, steps and the simulated step (times in s, tokens in tokens)."""

    index: int
    start_tokens: float
    tokens: float
    batch_seqs: int
    batch_tokens: int
    seq_len: int
    steps: int
    microbatches: int
    step_time_s: float
    time_s: float
    tokens_per_s: float
    mfu: float
    fits: bool


@dataclass(slots=True)
class RunResult:
    """A whole run over its batch schedule.

    ``tokens`` is what whole steps train (at least the budget ``budget_tokens``);
    ``time_to_train_s`` in seconds; ``gpu_hours`` = time x GPUs / 3600; ``cost`` in ``currency``
    (None without a price). ``mfu`` is the time-weighted mean over phases. ``simulations`` counts
    the distinct step configurations (simulated once each). ``time_to_train_range_s``: the likely
    measured time to train, each phase's steps times its step's ``error_band`` (None without bands),
    from ``range_basis``'s runs, a prediction interval of ``range_coverage`` (the phases' lowest).
    """

    name: str
    n_gpus: int
    budget_tokens: float
    tokens: float
    steps: int
    time_to_train_s: float
    gpu_hours: float
    cost: float | None
    currency: str
    price_per_gpu_hour: float | None
    mfu: float
    fits: bool
    simulations: int
    phases: list[PhaseResult] = field(default_factory=list)
    time_to_train_range_s: tuple[float, float] | None = None
    range_basis: str | None = None
    range_coverage: float | None = None
    goodput: GoodputResult | None = None
    """Under failures and checkpoints (``run.failures``/``run.checkpoint``; None without them)."""
    goodput_inputs: GoodputInputs | None = field(default=None, repr=False)
    """What ``simtrain.studies.goodput.interval_sweep`` needs (not in ``to_dict``)."""

    @property
    def time_to_train_days(self) -> float:
        """Time to train in days."""
        return self.time_to_train_s / S_PER_DAY

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``time_to_train_s``, ``gpu_hours``, ``cost``, ``phases``, ..."""
        out = asdict(replace(self, goodput=None, goodput_inputs=None))
        del out["goodput"], out["goodput_inputs"]
        out["time_to_train_days"] = self.time_to_train_days
        if self.goodput is not None:
            out["goodput"] = self.goodput.to_dict()
        return out


def phase_config(run: RunConfig, phase: Phase) -> RunConfig:
    """The one-step config of a phase: ``train``'s batch (and sequence length) set, no ``run`` section."""
    train = run.train.model_copy(update={"global_batch_seqs": phase.batch_seqs, "global_batch_tokens": None,
                                         "seq_len": phase.seq_len})
    return run.model_copy(update={"train": train, "run": None})


def _default_simulate(mode: str | None) -> SimulateFn:
    from simtrain.studies.simulate import simulate
    from simtrain.studies.variability import nominal

    return lambda cfg: simulate(nominal(cfg), mode=mode)


def _simulate_phase(cfg: RunConfig, phase: Phase, sim: SimulateFn, cache: dict[str, StepResult],
                    key: str) -> StepResult:
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        result = sim(cfg)
    except ConfigError as exc:
        raise ConfigError([Problem(phase.source, f"phase {phase.index} ({phase.batch_seqs} sequences of "
                                                 f"{phase.seq_len} tokens): {p}") for p in exc.problems]) from None
    cache[key] = result
    return result


def simulate_run(config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None,
                 mode: str | None = None, simulate_fn: SimulateFn | None = None,
                 cache: dict[str, StepResult] | None = None, goodput: bool = False,
                 progress: bool = False) -> RunResult:
    """Simulate a whole run: every distinct phase once, then steps x step time summed over phases.

    Args:
        config: a RunConfig, dict or YAML/JSON path with a ``run:`` section.
        overrides: dotted ``key=value`` overrides (as ``--set``), e.g. ``run.tokens=1.4T``.
        mode: "symmetric" or "full" (default: the config's ``sim.mode``).
        simulate_fn: replaces ``simtrain.studies.simulate`` (tests, or a caller's own cache).
        cache: StepResults by resolved-config JSON, shared across calls (e.g. by a sweep).
        goodput: compute the goodput even without ``run.failures``/``run.checkpoint`` (their defaults).
        progress: a bar with its ETA on stderr (``simtrain.studies.progress``), one unit per phase.

    Raises:
        ConfigError: invalid input or no ``run`` section (each problem with its dotted path).
        InfeasibleLayout: a phase cannot be simulated.
    """
    run = load_config(config, overrides)
    phases = resolve_phases(run)
    assert run.run is not None
    check_spec(run.run.checkpoint)
    sim = simulate_fn or _default_simulate(mode)
    cache = {} if cache is None else cache
    keys: set[str] = set()
    out: list[PhaseResult] = []
    bands: list[ErrorBand | None] = []
    steps: list[StepResult] = []
    from simtrain.studies.progress import progress_bar

    with progress_bar("simulating phases", len(phases), enabled=progress) as advance:
        for ph in phases:
            cfg = phase_config(run, ph)
            key = cfg.model_dump_json()
            keys.add(key)
            r = _simulate_phase(cfg, ph, sim, cache, key)
            out.append(PhaseResult(ph.index, ph.start_tokens, ph.tokens, ph.batch_seqs, ph.batch_tokens, ph.seq_len,
                                   ph.steps, r.microbatches, r.step_time_s, ph.steps * r.step_time_s,
                                   r.tokens_per_s, r.mfu, r.fits))
            bands.append(r.error_band)
            steps.append(r)
            advance(1)
    result = _summarise(run, out, len(keys))
    built = build_inputs(run, steps, result.time_to_train_s, result.steps, result.n_gpus, force=goodput)
    if built is not None:
        result.goodput_inputs = built[0]
        result.goodput = goodput_of(*built)
    known = [b for b in bands if b is not None]
    if out and len(known) == len(out):
        result.time_to_train_range_s = (sum(p.steps * b.low_s for p, b in zip(out, known, strict=True)),
                                        sum(p.steps * b.high_s for p, b in zip(out, known, strict=True)))
        result.range_basis, result.range_coverage = known[0].basis, min(b.coverage for b in known)
    return result


def _summarise(run: RunConfig, phases: list[PhaseResult], simulations: int) -> RunResult:
    spec = run.run
    assert spec is not None
    from simtrain.studies.simulate import cluster_of

    n_gpus = cluster_of(run).n_gpus
    time_s = sum(p.time_s for p in phases)
    gpu_hours = time_s * n_gpus / S_PER_HOUR
    price = spec.price_per_gpu_hour
    mfu = sum(p.mfu * p.time_s for p in phases) / time_s if time_s > 0 else 0.0
    return RunResult(name=run.name, n_gpus=n_gpus, budget_tokens=spec.tokens, tokens=sum(p.tokens for p in phases),
                     steps=sum(p.steps for p in phases), time_to_train_s=time_s, gpu_hours=gpu_hours,
                     cost=None if price is None else gpu_hours * price, currency=spec.currency,
                     price_per_gpu_hour=price, mfu=mfu, fits=all(p.fits for p in phases),
                     simulations=simulations, phases=phases)


def render_run(r: RunResult) -> str:
    """Human-readable summary of a RunResult with its per-phase table."""
    cost = "-" if r.cost is None else f"{r.cost:,.0f} {r.currency} at {r.price_per_gpu_hour:g} {r.currency}/GPU-hour"
    lines = [
        f"simtrain run: {r.name}  ({r.n_gpus:,} GPUs)",
        f"  tokens         {r.tokens:,.0f} trained (budget {r.budget_tokens:,.0f}) in {r.steps:,} steps",
        f"  time to train  {r.time_to_train_s:,.0f} s = {r.time_to_train_days:,.2f} days",
        *([] if r.time_to_train_range_s is None else [
            f"  likely range   {r.time_to_train_range_s[0] / S_PER_DAY:,.2f} - "
            f"{r.time_to_train_range_s[1] / S_PER_DAY:,.2f} days measured ({100 * (r.range_coverage or 0):.0f} % "
            f"prediction interval from simtrain's error on {r.range_basis})"]),
        f"  GPU-hours      {r.gpu_hours:,.0f}",
        f"  cost           {cost}",
        f"  MFU            {100 * r.mfu:.1f} % (time-weighted over phases); {r.simulations} distinct step(s) simulated",
        "  phases:",
        f"    {'#':>3} {'start tokens':>16} {'batch seqs':>11} {'batch tokens':>13} {'seq':>6} {'steps':>10} "
        f"{'mbs/step':>9} {'step (s)':>10} {'time (h)':>10} {'MFU %':>6}  fits",
    ]
    for p in r.phases:
        lines.append(f"    {p.index:>3} {p.start_tokens:>16,.0f} {p.batch_seqs:>11,} {p.batch_tokens:>13,} {p.seq_len:>6} "
                     f"{p.steps:>10,} {p.microbatches:>9} {p.step_time_s:>10.3f} {p.time_s / S_PER_HOUR:>10,.1f} "
                     f"{100 * p.mfu:>6.1f}  {'yes' if p.fits else 'NO'}")
    if r.goodput is not None:
        lines += render_goodput(r.goodput)
    if not r.fits:
        lines.append("  warning: at least one phase does not fit in GPU memory")
    return "\n".join(lines)


def batch_whatif(config: RunConfig | dict[str, Any] | str | Path, batch_tokens: list[int],
                 overrides: list[str] | None = None, b_noise_tokens: float | None = None,
                 target_loss: float | None = None, e_min_tokens: float | None = None,
                 simulate_fn: SimulateFn | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time to the target loss against the global batch (constant batch, the config's layout).

    Each batch is simulated for its step time; steps to the target come from the McCandlish et al.
    2018 model (``simtrain.studies.convergence``), anchored on the config's run (its token budget at
    ``train``'s batch reaches the target). A batch that is not whole micro-batches per data-parallel rank is
    rounded to the nearest that is (``simtrain.spec.load.round_token_batch``; the row gives the batch simulated).

    Returns:
        (rows, info): one dict per batch with unit-suffixed keys (``time_to_target_s``,
        ``time_to_train_s`` for the fixed token budget, ...), and the model's label and parameters.
    """
    from simtrain.spec.errors import SimtrainError
    from simtrain.studies.convergence import deepseek_flops_per_token, describe, noise_model

    run = load_config(config, overrides)
    if run.run is None:
        raise ConfigError(Problem("run.tokens", "missing: the what-if anchors on the planned run; add a 'run:' "
                                                "section with 'tokens' (e.g. --set run.tokens=1.4T)"))
    anchor_b = run.train.global_batch_seqs_resolved * run.train.seq_len
    model, source = noise_model(anchor_b, run.run.tokens, b_noise_tokens, target_loss, e_min_tokens)
    compute = deepseek_flops_per_token(run.model, run.train.seq_len) * run.run.tokens
    info = describe(model, source, compute)
    sim = simulate_fn or _default_simulate(None)
    from simtrain.studies.simulate import cluster_of

    n_gpus = cluster_of(run).n_gpus
    price = run.run.price_per_gpu_hour
    rows = []
    for b in batch_tokens:
        row: dict[str, Any] = {"train.global_batch_tokens": int(b), "b_noise_tokens": model.b_noise_tokens,
                               "error": None}
        try:
            cfg = load_config(run.model_copy(update={"run": None}), [f"train.global_batch_tokens={int(b)}",
                                                                      "train.global_batch_seqs=null"])
            b = row["train.global_batch_tokens"] = cfg.train.global_batch_tokens or int(b)  # as rounded by load_config
            r = sim(cfg)
        except SimtrainError as exc:
            row["error"] = str(exc)
            rows.append(row)
            continue
        steps = math.ceil(model.steps(b))
        time_s = steps * r.step_time_s
        row.update({"step_time_s": r.step_time_s, "mfu": r.mfu, "fits": r.fits, "microbatches": r.microbatches,
                    "steps_to_target": steps, "tokens_to_target": steps * float(b), "time_to_target_s": time_s,
                    "gpu_hours_to_target": time_s * n_gpus / S_PER_HOUR,
                    "cost_to_target": None if price is None else time_s * n_gpus / S_PER_HOUR * price,
                    "time_to_train_s": math.ceil(run.run.tokens / b) * r.step_time_s})
        rows.append(row)
    return rows, info
