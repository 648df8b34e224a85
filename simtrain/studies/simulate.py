"""``simulate(config) -> StepResult``: the whole pipeline, one plain function per arrow.

load_config -> RankGrid + Fabric (``fabric_of``) -> lower() -> static memory -> Engine.run() -> StepResult.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.engine import invariants
from simtrain.engine.axes import AXES
from simtrain.engine.comm_planner import CommPlanner, symmetry_violation
from simtrain.engine.engine import Engine
from simtrain.engine.gc_pause import gc_paused
from simtrain.engine.prepare import attach_static_memory as _attach_static_memory
from simtrain.engine.prepare import group_axes as _group_axes
from simtrain.engine.records import EngineResult, RankStats
from simtrain.engine.results import StageMemory, StepResult
from simtrain.engine.steady import SteadyPlan, affine_at, extrapolate, plan
from simtrain.engine.sync_wait import rank_wait_s
from simtrain.hardware.fabric.perturb import gpu_speeds, perturb
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.fabric.wiring import fabric_of
from simtrain.hardware.hardware import ClusterSpec, GpuSpec
from simtrain.hardware.profile import compute_calibration, run_cluster
from simtrain.lower.flops import model_flops_per_step
from simtrain.lower.layer_plan import microbatches
from simtrain.lower.lowering import Lowered
from simtrain.lower.memory import (
    closed_form_peak,
)
from simtrain.plan.layout import RankGrid
from simtrain.plan.load import load_config
from simtrain.plan.roles import MAX_ROLES, roles
from simtrain.plan.routing import rank_load_factors, symmetric_load_factors
from simtrain.spec.config import RunConfig, TrainConfig
from simtrain.spec.errors import ConfigError, InfeasibleLayout, problem
from simtrain.spec.whatif_spec import WhatIfSpec
from simtrain.studies import variability
from simtrain.studies.uncertainty import band_for, read_error_table
from simtrain.studies.whatif import key_ranks, summary, whatif_mode

#: Largest world that symmetric mode hands to full mode when its ranks play too many roles.
FULL_MODE_WORLD = 512


def cluster_of(run: RunConfig) -> ClusterSpec:
    """The ClusterSpec a run's hardware section describes (with ``hardware.profile``'s calibration applied)."""
    return run_cluster(run.hardware, run.layout.world_size)


def simulate(config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None,
             mode: str | None = None, trace: bool = False,
             error_table: str | Path | None = None, fabric: nx.Graph | None = None) -> StepResult:
    """Simulate one training step.

    Args:
        config: a RunConfig, a dict, or a YAML/JSON path.
        overrides: dotted ``key=value`` overrides (as ``--set``).
        mode: "symmetric" or "full" (default: the config's ``sim.mode``).
        trace: keep every executed op for a Chrome trace.
        error_table: the measured-run errors behind ``StepResult.error_band`` (a CSV of
            ``simtrain.studies.uncertainty.COLUMNS``; default: simtrain's errors on the published runs).
        fabric: a fabric graph built in Python (``networkx``, the schema of
            ``simtrain.hardware.fabric.schema``) to simulate on instead of ``hardware.fabric``.

    Raises:
        ConfigError: invalid input (every problem, with its dotted path).
        InfeasibleLayout: valid input that cannot be simulated as asked.
        SimulationInvariantError: the result broke an invariant (``simtrain.engine.invariants``): a bug.
    """
    run = load_config(config, overrides)
    if run.whatif.active and run.sim.variability is not None:
        raise ConfigError(problem("sim.variability", run.sim.variability.model_dump(),
                                  "no variability with a whatif (a what-if compares one perturbed step with the "
                                  "nominal one): drop sim.variability, or the whatif section"))
    # lowering and costing a long step makes millions of objects too: no collector passes over them (gc_pause)
    with gc_paused():
        if run.whatif.active:  # the step with and without the perturbations (simtrain.studies.whatif)
            return _whatif(run, mode, trace, error_table, fabric)
        return _simulate(run, mode, trace, error_table, fabric)[0]


def _whatif(run: RunConfig, mode: str | None, trace: bool, error_table: str | Path | None,
            fabric: nx.Graph | None) -> StepResult:
    """The perturbed step (first: a bad name fails fast), then the unperturbed one in the same mode."""
    mode, note = whatif_mode(run.whatif, mode or run.sim.mode, run.layout.world_size, FULL_MODE_WORLD)
    result, ranks = _simulate(run, mode, trace, error_table, fabric)
    base, base_ranks = _simulate(run.model_copy(update={"whatif": WhatIfSpec()}), mode, False, error_table, fabric)
    cluster = cluster_of(run)
    result.whatif = summary(run.whatif, result.step_time_s, base.step_time_s, ranks, base_ranks,
                            cluster.gpus_per_node, gpu_speeds(run.whatif, cluster))
    if note:
        result.notes.insert(0, note)
    return result


def _simulate(run: RunConfig, mode: str | None, trace: bool, error_table: str | Path | None,
              fabric: nx.Graph | None = None) -> tuple[StepResult, tuple[int, int]]:
    """``simulate`` of a loaded run: the result, and its critical and bottleneck ranks
    (``simtrain.studies.whatif.key_ranks``)."""
    cluster = cluster_of(run)
    gpu = cluster.gpu
    grid = RankGrid(run.layout)
    cost = ComputeCostModel(gpu, run.train.precision, calibration=compute_calibration(gpu),
                            stack=run.train.stack_spec, fp8_recipe=run.train.fp8_recipe)
    mode = mode or run.sim.mode
    topo = perturb(fabric_of(run.hardware.fabric, cluster, fabric), cluster, run.whatif)  # as is without link what-ifs
    notes = []
    reps: list[list[int]] = []
    if mode == "symmetric" and (why := symmetry_violation(grid, topo)) is not None:
        reps = roles(grid, topo, _group_axes(run))
        if len(reps) > MAX_ROLES and grid.world_size <= FULL_MODE_WORLD:
            mode, reps = "full", []
            notes.append(f"simulated every rank (full mode): symmetric mode needs interchangeable ranks, but {why}, "
                         f"and the ranks play more than {MAX_ROLES} roles")
        elif len(reps) > MAX_ROLES:
            raise InfeasibleLayout(f"symmetric mode needs interchangeable ranks, but {why}, and the ranks play more "
                                   f"than {MAX_ROLES} roles (distinct group placements), while full mode would simulate "
                                   f"{grid.world_size} ranks: choose a layout.order with tp innermost, or a layout "
                                   f"whose groups tile the nodes, or sim.mode=full to wait for every rank",
                                   roles=len(reps), world_size=grid.world_size)
        else:
            notes.append(f"symmetric mode by role: {why}, so ranks whose groups are placed differently on the nodes "
                         f"were simulated apart ({len(reps)} role{'s' if len(reps) > 1 else ''}, one representative rank per "
                         "stage each; "
                         "the slowest role sets the step, as all ranks meet at the step's synchronisations)")
    symmetric = mode == "symmetric"
    if symmetric and not topo.rail_symmetric:
        notes.append("symmetric mode on a fabric graph other than the rail-optimised one: every group of each stage "
                     "was planned over the graph and each representative's routes weighted by the copies on every "
                     "edge; ranks of a stage are taken to see the same fabric (for an asymmetric graph use --mode full)")
    step = _Step(run, cost, cluster, grid, topo, symmetric, CommPlanner(topo, gpu, grid, symmetric), reps,
                 gpu_speeds(run.whatif, cluster))
    m = microbatches(run)
    steady = plan(run.layout.resolved_schedule, run.layout.pp, m)
    outcome = _steady_state(step, steady) if run.sim.steady_state and not trace and steady else None
    if outcome is None:
        lowered, res = step.engine_run(run.train, trace)
        closed = _closed_form_peaks(lowered)
    else:
        res, closed, note = outcome
        notes.append(note)
    notes.extend(res.notes)  # the engine's, e.g. full mode fell back to every rank (simtrain.engine.merge)
    result = _result(run, mode, m, res, cluster, grid, closed)
    critical = res.critical_rank()
    if len(reps) > 1:
        role = next(i for i, r in enumerate(reps) if critical in r)
        notes.append(f"critical role: role {role} (rank {reps[role][0]}'s placement; the representatives of the "
                     f"roles on stage 0 are ranks {', '.join(str(r[0]) for r in reps)})")
    invariants.check(result, gpu, run.train.precision, min(lg.min_total for lg in res.ledgers.values()))
    if run.sim.variability is not None:
        result.variability = _variability(step, steady, result.step_time_s)
    result.notes.extend([*run.assumptions, *notes])  # run.assumptions: what load_config filled in
    result.error_band = band_for(result.step_time_s, run.train.stack_name, run.model.is_moe, gpu.name,
                                 read_error_table(error_table))
    return result, key_ranks(res)


@dataclass(frozen=True, slots=True)
class _Step:
    """What one engine run needs besides the batch: the run, its cost model, cluster, grid and topology."""

    run: RunConfig
    cost: ComputeCostModel
    cluster: ClusterSpec
    grid: RankGrid
    topo: Fabric
    symmetric: bool
    planner: CommPlanner
    """Collective plans shared by every engine run of the step (pure memos of the topology)."""
    roles: list[list[int]]
    """Symmetric mode by role (``simtrain.plan.roles``): each role's representative per stage; [] when
    the ranks of a stage are interchangeable (one representative per stage)."""
    speed: dict[int, float] = field(default_factory=dict)
    """Compute speed factor per simulated rank: full mode's ``whatif`` (rank r runs on GPU r,
    ``plan.layout.place``), or a ``sim.variability`` draw (either mode); missing ranks run at 1."""

    def representatives(self) -> list[list[int]]:
        """Symmetric mode's simulated ranks: one list per role, one rank per stage (the stages'
        representatives when the ranks of a stage are interchangeable)."""
        return self.roles or [[self.grid.representative(s) for s in range(self.run.layout.pp)]]

    def engine_run(self, train: TrainConfig, trace: bool = False) -> tuple[Lowered, EngineResult]:
        """Lower the run with ``train``'s batch and simulate it on the engine."""
        run = self.run.model_copy(update={"train": train})
        lowered = lower(run, self.cost, self.cluster.node.host_link_Bps)
        if lowered.microbatches < 1:
            raise InfeasibleLayout("fewer sequences than data-parallel ranks", microbatches=lowered.microbatches)
        _attach_static_memory(run, lowered, self.cluster.gpu.cuda_context_bytes + self.cluster.gpu.nccl_buffer_bytes)
        grid = self.grid
        if not self.symmetric:
            ranks = list(range(grid.world_size))
            engine = Engine(lowered.programs, grid, self.topo, self.cluster.gpu, symmetric=False, trace=trace,
                            load_factor=rank_load_factors(run, grid, ranks), planner=self.planner,
                            speed=self.speed)
            return lowered, engine.run()
        # one engine run per role, each on its own network (roles share no simulated link: each run's
        # flows already carry its copies' weights); the step is the slowest role's
        results = []
        for reps in self.representatives():
            engine = Engine(lowered.programs, grid, self.topo, self.cluster.gpu, symmetric=True, trace=trace,
                            load_factor=symmetric_load_factors(run, reps), planner=self.planner,
                            representatives=reps, speed=self.speed)
            results.append(engine.run())
        return lowered, _merge(results)


def _variability(step: _Step, steady: SteadyPlan | None, nominal_s: float) -> dict[str, Any]:
    """``StepResult.variability``: the step simulated once per seeded draw of every GPU's speed
    (``simtrain.studies.variability``), as the nominal step was (steady-state shortcut where it applies)."""
    run = step.run
    spec = run.sim.variability
    assert spec is not None
    rng = np.random.default_rng(run.sim.seed)
    reps = step.representatives()
    times, slowest = [], []
    for _ in range(spec.samples):
        speeds = variability.draw_speeds(rng, step.grid.world_size, spec.gpu_speed_cv)
        drawn = replace(step, speed=variability.rank_speeds(step.grid, speeds, step.symmetric, reps))
        outcome = _steady_state(drawn, steady) if run.sim.steady_state and steady else None
        res = outcome[0] if outcome is not None else drawn.engine_run(run.train)[1]
        wait = _sync_wait(res.stats[res.critical_rank()], step.cluster.gpu, step.grid.world_size)
        times.append(res.step_time_s + wait)
        slowest.append(float(speeds.min()))
    return variability.summary(spec, run.sim.seed, nominal_s, times, slowest)


def _merge(results: list[EngineResult]) -> EngineResult:
    """One EngineResult of the per-role runs: every role's ranks; the step is the slowest role's."""
    if len(results) == 1:
        return results[0]
    out = EngineResult(max(r.step_time_s for r in results), [], {}, {}, [], 0, results[0].plans)
    for r in results:
        out.ranks.extend(r.ranks)
        out.stats.update(r.stats)
        out.ledgers.update(r.ledgers)
        out.trace.extend(r.trace)
        out.ops_executed += r.ops_executed
    return out


def _steady_state(step: _Step, steady: SteadyPlan) -> tuple[EngineResult, list[float], str] | None:
    """The engine's result at the full micro-batch count from short runs a period apart
    (``simtrain.engine.steady``), with each stage's closed-form peak and a note; None when no three of the
    runs the budget allows are in one steady state, or the schedule rejects a short count."""
    train = step.run.train
    per_microbatch = train.micro_batch_size * step.run.layout.dp
    last: deque[tuple[int, EngineResult, list[float]]] = deque(maxlen=3)  # only three kept: timelines are big
    simulated = ops = 0
    for count in steady.counts():
        short = train.model_copy(update={"global_batch_seqs": count * per_microbatch, "global_batch_tokens": None})
        try:
            lowered, res = step.engine_run(short)
        except (InfeasibleLayout, ValueError):
            return None  # e.g. interleaved 1F1B's micro-batch group rule at this count
        last.append((count, res, _closed_form_peaks(lowered)))
        simulated, ops = simulated + count, ops + res.ops_executed
        if len(last) < 3:
            continue
        k = steady.periods_added(count)
        out = extrapolate([r for _, r, _ in last], k)
        if out is not None:
            closed = [affine_at([c[s] for _, _, c in last], k) for s in range(len(last[0][2]))]
            out.ops_executed = ops
            return out, closed, steady.note([n for n, _, _ in last], simulated)
    return None


def _closed_form_peaks(lowered: Lowered) -> list[float]:
    """Each stage's closed-form peak (bytes, before fragmentation): static memory plus the schedule's
    in-flight activations (``memory.closed_form_peak``)."""
    return [sum(prog.static_mem.values()) + closed_form_peak(lowered.schedule[s], lowered.chunk_memory[s])
            for s, prog in enumerate(lowered.programs)]


def _stage_memory(run: RunConfig, res: EngineResult, grid: RankGrid, capacity: float,
                  closed: list[float]) -> list[StageMemory]:
    frag = run.sim.fragmentation_ratio
    out = []
    for s in range(run.layout.pp):
        ranks = [r for r in res.ranks if grid.stage_of(r) == s]
        led = max((res.ledgers[r] for r in ranks), key=lambda lg: lg.peak)
        peak = led.peak * (1 + frag)
        comps = {k: v for k, v in led.at_peak.items() if abs(v) > 0}
        comps["fragmentation"] = led.peak * frag
        out.append(StageMemory(s, peak, comps, capacity, closed[s] * (1 + frag), peak <= capacity, led.timeline))
    return out


def _compute_s(st: RankStats) -> float:
    return st.busy["fwd"] + st.busy["bwd"] + st.busy["recompute"]


def _sync_wait(st: RankStats, gpu: GpuSpec, world_size: int) -> float:
    """Seconds the step waits for its slowest rank beyond the engine's step of identical ranks
    (``simtrain.engine.sync_wait``): the jitter of the critical rank's (``st``) compute and optimizer seconds
    over the ranks that meet at the step's synchronisations (all of them: the gradients' reduction)."""
    return rank_wait_s(gpu, _compute_s(st) + st.busy["optimizer"], world_size)


def _breakdown(st: RankStats, step: float, max_compute_s: float, sync_wait: float = 0.0) -> dict[str, Any]:
    """Where the critical rank's step went (seconds). Its waits for pipeline inputs are split in two:
    ``stage_imbalance``, the part a slower rank's extra compute explains (max_compute_s - its own
    compute: in 1F1B's steady state every stage runs at the slowest one's pace, so a lighter stage idles
    that much over the step), and ``bubble``, the rest (the schedule's fill and drain). ``offload``: its
    waits for CPU activation offload/reload copies (``simtrain.lower.offload``). ``step`` is the engine's;
    ``sync_wait`` (``_sync_wait``) comes on top of it."""
    compute = _compute_s(st)
    exposed = {a: st.exposed.get(a, 0.0) for a in AXES}
    tail = max(step - max(st.last_compute_end_s, 0.0), 0.0)
    if tail > 0:
        axis = st.last_axis if st.last_axis in exposed else "dp"
        exposed[axis] += tail
    imbalance = min(st.bubble_s, max(max_compute_s - compute, 0.0))
    offload = st.exposed.get("offload", 0.0)  # waits for CPU activation offload/reload copies
    known = compute + st.busy["optimizer"] + sum(exposed.values()) + st.bubble_s + offload
    return {"compute": compute, "exposed_comm": exposed, "bubble": st.bubble_s - imbalance,
            "stage_imbalance": imbalance, "offload": offload, "optimizer": st.busy["optimizer"],
            "other": max(step - known, 0.0), "sync_wait": sync_wait}


def _result(run: RunConfig, mode: str, microbatches: int, res: EngineResult, cluster: ClusterSpec,
            grid: RankGrid, closed: list[float]) -> StepResult:
    critical = res.critical_rank()
    wait = _sync_wait(res.stats[critical], cluster.gpu, grid.world_size)
    step = res.step_time_s + wait
    n = cluster.n_gpus
    tokens = run.train.global_batch_seqs_resolved * run.train.seq_len
    peak = cluster.gpu.bf16_flops_per_s  # MFU against the dense BF16 peak whatever the precision (README)
    model_flops = model_flops_per_step(run.model, run.train.seq_len, tokens)
    per_stage_flops = [max(res.stats[r].flops for r in res.ranks if grid.stage_of(r) == s)
                       for s in range(run.layout.pp)]
    hw_per_gpu = sum(per_stage_flops) / run.layout.pp
    max_compute_s = max(_compute_s(res.stats[r]) for r in res.ranks)
    memory = _stage_memory(run, res, grid, cluster.gpu.hbm_bytes, closed)
    return StepResult(
        name=run.name, mode=mode, step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / n,
        model_tflops_per_gpu=model_flops / step / n / 1e12, hardware_tflops_per_gpu=hw_per_gpu / step / 1e12,
        mfu=model_flops / (step * n * peak), hfu=hw_per_gpu / (step * peak), n_gpus=n, global_batch_tokens=tokens,
        microbatches=microbatches, memory=memory,
        breakdown_s=_breakdown(res.stats[critical], res.step_time_s, max_compute_s, wait),
        fits=all(m.fits for m in memory), layout=run.layout.model_dump(mode="json"),
        ops_executed=res.ops_executed, trace=res.trace, stage_of={r: grid.stage_of(r) for r in res.ranks},
    )
