"""Goodput over a whole run: failures, checkpoints, restarts (``run.failures``, ``run.checkpoint``).

A run of ``T_s`` seconds of failure-free training (``simtrain.studies.run``) on ``N`` GPUs that fail as a Poisson
process at ``per_gpu_hour`` failures per GPU-hour has a mean time between failures ``M = 3600 / (rate x N)``
seconds. It saves a checkpoint every ``tau`` seconds of training, each stalling training ``delta`` seconds;
each failure costs a restart ``R`` (detect, reschedule, re-initialise), a reload of the last checkpoint
``L`` and the work done since that checkpoint. Expected wall time (Daly 2006, "A higher order estimate of
the optimum checkpoint interval for restart dumps", Future Gener. Comput. Syst. 22:303-312, exact
for exponential failures that may also strike during restarts and saves)::

    T_w(tau) = M exp((R + L) / M) (exp((tau + delta) / M) - 1) T_s / tau

and the interval that minimises it, Young (1974, "A first order approximation to the optimum checkpoint
interval", CACM 17(9):530) ``tau = sqrt(2 delta M)`` and Daly's higher-order form (Daly 2006)::

    tau_opt = sqrt(2 delta M) [1 + sqrt(delta / (2M)) / 3 + (delta / (2M)) / 9] - delta   (delta < 2M)
    tau_opt = M                                                                              (delta >= 2M)

Goodput is ``T_s / T_w``: the productive share of wall time. To first order each failure loses half a
segment ``(tau + delta) / 2`` of work plus ``R + L``. Checkpoints are taken between optimizer steps, so
every interval (given in seconds, or ``auto``: Daly's) is rounded to whole steps, at least one.

Checkpoint bytes come from the simulated step's static memory (``StepResult.memory`` components
``weights`` and ``optimizer``: bf16 weights and Adam's fp32 master + m + v, as Megatron's distributed
checkpoint stores them): every byte once, i.e. each rank's state divided by the number of ranks holding
the same bytes (the data-parallel replicas, fewer under ZeRO/FSDP sharding), spread over all the ranks
as Megatron-core's fully parallel save does (``--ckpt-fully-parallel-save``,
``megatron/core/dist_checkpointing/strategies/fully_parallel.py`` distributes replicated shards over the
data-parallel ranks). Every node writes its GPUs' shares to storage in parallel at ``write_GBps_per_node``.

- synchronous save: training stalls for the write, ``delta = node bytes / write bandwidth``;
- asynchronous save (Megatron ``--async-save``, PyTorch DCP ``async_save``): training stalls only for the
  device-to-host snapshot of a GPU's share at the hardware's host copy rate; the write runs in the
  background and must finish before the next snapshot (a shorter interval stalls for the rest), and a
  failure rolls back past the checkpoint still in flight (its write time is added to the loss).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from simtrain.engine.results import StepResult
from simtrain.hardware.profile import run_cluster
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, InfeasibleLayout, Problem
from simtrain.spec.goodput_spec import (
    GB,
    LLAMA3_FAILURES_SOURCE,
    S_PER_HOUR,
    CheckpointSpec,
    FailureSpec,
)


@dataclass(frozen=True, slots=True)
class CheckpointCost:
    """What one checkpoint costs. Bytes, seconds."""

    total_bytes: float
    """The whole checkpoint: every byte of weights and optimizer state once."""
    node_bytes: float
    """Bytes the busiest node writes (its GPUs' shares)."""
    gpu_bytes: float
    """Bytes the busiest GPU snapshots (its share)."""
    write_s: float
    """Time to write the checkpoint to storage (all nodes in parallel)."""
    snapshot_s: float
    """Time to copy a GPU's share to host memory (asynchronous save)."""
    reload_s: float
    """Time to read the checkpoint back after a failure."""


@dataclass(slots=True)
class GoodputResult:
    """A run's goodput under failures and checkpoints. Seconds, GPU-hours, bytes.

    ``goodput`` = ``failure_free_time_s / time_to_train_s``; the time to train is the sum of the failure-free
    time, ``checkpoint_s``, ``restart_s`` and ``lost_work_s`` (work re-done after failures).
    """

    goodput: float
    time_to_train_s: float
    gpu_hours: float
    failure_free_time_s: float
    failure_free_gpu_hours: float
    interval_s: float
    interval_steps: float
    interval_source: str
    young_interval_s: float
    daly_interval_s: float
    mtbf_s: float
    failures: float
    checkpoints: float
    checkpoint_s: float
    restart_s: float
    lost_work_s: float
    lost_per_failure_s: float
    stall_per_checkpoint_s: float
    mode: str
    checkpoint: CheckpointCost
    assumptions: list[str] = field(default_factory=list)

    @property
    def time_to_train_days(self) -> float:
        """Time to train in days."""
        return self.time_to_train_s / 86400.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field, plus ``time_to_train_days``."""
        out = asdict(self)
        out["time_to_train_days"] = self.time_to_train_days
        return out


@dataclass(frozen=True, slots=True)
class GoodputInputs:
    """Everything the closed forms need: the failure-free run and the checkpoint's cost. Seconds."""

    failure_free_s: float
    steps: int
    n_gpus: int
    failures: FailureSpec
    checkpoint: CheckpointSpec
    cost: CheckpointCost

    @property
    def mtbf_s(self) -> float:
        """The run's mean time between failures, s (inf without failures)."""
        rate = self.failures.per_gpu_hour * self.n_gpus / S_PER_HOUR
        return math.inf if rate == 0 else 1.0 / rate

    @property
    def step_s(self) -> float:
        """Mean failure-free step time, s."""
        return self.failure_free_s / self.steps


def _state_share(comps: dict[str, float], run: RunConfig) -> float:
    """Bytes of checkpointed state one rank of a stage writes: its weights and optimizer state, each
    divided by the ranks holding the same bytes (dense: the data-parallel group, over which ZeRO shards;
    routed experts: the expert-data-parallel group), so that the ranks together write every byte once."""
    lay, model = run.layout, run.model
    stage = lay.shard_stage
    shard = lay.fsdp_shard_size if lay.fsdp == "hybrid" and lay.fsdp_shard_size else lay.data_degree
    dd, edp = lay.data_degree, lay.expert_data_degree
    e_shard = edp  # ZeRO shards expert state over the expert-data-parallel group (simulate._attach_static_memory)
    # Share of a rank's parameters that are routed experts: experts are split over EP x ETP, the rest
    # over TP (simtrain.lower.memory.expert_static_memory); the whole model's counts give the ratio.
    p_e = model.routed_expert_param_count() if model.moe is not None else 0
    p_d = model.param_count() - p_e
    dense, expert = p_d / lay.tp, p_e / (lay.ep * lay.expert_tp)

    def per_byte(sharded: bool) -> float:
        # bytes written per byte held: 1 / copies, weighted over dense and expert parameters as held
        d_held = dense / (shard if sharded else 1)
        e_held = expert / (e_shard if sharded else 1)
        d_copies = dd / (shard if sharded else 1)
        e_copies = edp / (e_shard if sharded else 1)
        return (d_held / d_copies + e_held / e_copies) / (d_held + e_held)

    return comps.get("weights", 0.0) * per_byte(stage >= 3) + comps.get("optimizer", 0.0) * per_byte(stage >= 1)


def checkpoint_cost(run: RunConfig, steps: list[StepResult], spec: CheckpointSpec) -> CheckpointCost:
    """One checkpoint's bytes and times from the simulated steps' static memory (the largest over phases)."""
    cluster = run_cluster(run.hardware, run.layout.world_size)
    ranks_per_stage = run.layout.world_size // run.layout.pp
    gpu = max(_state_share(m.components, run) for s in steps for m in s.memory)
    total = max(sum(_state_share(m.components, run) for m in s.memory) * ranks_per_stage for s in steps)
    model = run.model
    if model.tied_embeddings and run.layout.pp > 1:
        # the last stage holds a copy of the tied embedding for the LM head, which the checkpoint stores
        # once: Megatron-core LanguageModule.tie_embeddings_and_output_weights_state_dict marks it a replica
        # of the first stage's (megatron/core/models/common/language_module/language_module.py)
        n = model.param_count()
        total *= n / (n + model.embedding_params())
    n_nodes = max(1, run.layout.world_size // cluster.gpus_per_node)
    # pp is the outermost rank axis in the default layout.order (simtrain.plan.layout): a node's GPUs belong to one stage unless a stage
    # has fewer ranks than a node has GPUs, when each node holds a slice of every stage
    node = gpu * cluster.gpus_per_node if ranks_per_stage >= cluster.gpus_per_node else total / n_nodes
    write_bps = spec.write_GBps_per_node * GB
    read_bps = (spec.read_GBps_per_node or spec.write_GBps_per_node) * GB
    return CheckpointCost(total_bytes=total, node_bytes=node, gpu_bytes=gpu, write_s=node / write_bps,
                          snapshot_s=gpu / cluster.node.host_link_Bps, reload_s=node / read_bps)


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval sqrt(2 delta M), s."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum checkpoint interval (Daly 2006), s; M when delta >= 2M."""
    if math.isinf(mtbf_s):
        return math.inf
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def expected_wall_s(work_s: float, tau_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's complete model: expected wall time to do ``work_s`` of training with a checkpoint every
    ``tau_s`` (stall ``delta_s``), ``restart_s`` per failure, exponential failures of mean ``mtbf_s``."""
    if math.isinf(mtbf_s):
        return work_s * (1.0 + delta_s / tau_s)
    # M e^{R/M} (e^{(tau+delta)/M} - 1) per segment; expm1 keeps precision when tau + delta << M
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((tau_s + delta_s) / mtbf_s) * work_s / tau_s


def _stall_and_restart(inp: GoodputInputs, tau: float) -> tuple[float, float]:
    """(stall per checkpoint, restart cost per failure) at interval ``tau``, s."""
    c = inp.cost
    restart = inp.failures.restart_s + c.reload_s
    if inp.checkpoint.mode == "sync":
        return c.write_s, restart
    # async: the snapshot, plus waiting for the previous write when the interval is shorter than it;
    # a failure also loses the checkpoint still being written (rolls back one write time further)
    return c.snapshot_s + max(0.0, c.write_s - tau), restart + c.write_s


def auto_interval(inp: GoodputInputs) -> tuple[float, float, float]:
    """(chosen, Young, Daly) intervals, s: Daly's optimum, at least the write time under async saving
    (the next snapshot waits for the write), at most the whole run (one checkpoint at the end)."""
    delta, _ = _stall_and_restart(inp, math.inf)
    m = inp.mtbf_s
    young = min(young_interval(delta, m), inp.failure_free_s)
    daly = min(daly_interval(delta, m), inp.failure_free_s)
    chosen = max(daly, inp.cost.write_s) if inp.checkpoint.mode == "async" else daly
    return min(chosen, inp.failure_free_s), young, daly


def goodput_at(inp: GoodputInputs, tau_s: float, source: str = "given",
               assumptions: list[str] | None = None) -> GoodputResult:
    """The run's goodput with a checkpoint every ``tau_s`` seconds of training.

    Raises:
        InfeasibleLayout: failures come so often that the run would never finish.
    """
    m = inp.mtbf_s
    delta, restart = _stall_and_restart(inp, tau_s)
    t_s = inp.failure_free_s
    if not math.isinf(m) and (tau_s + delta + restart) / m > 50:
        raise InfeasibleLayout("failures come too often for the run to finish: a checkpoint interval plus a "
                               "restart takes far longer than the run's mean time between failures",
                               mtbf_s=round(m, 1), interval_s=round(tau_s, 1), restart_s=round(restart, 1))
    wall = expected_wall_s(t_s, tau_s, delta, restart, m)
    segments = t_s / tau_s
    ckpt_s = segments * delta
    if math.isinf(m):
        failures = restart_total = lost = 0.0
    else:
        # Daly's segment time split exactly: M (e^{s/M} - 1) = the segment s = tau + delta plus re-done
        # work; the e^{s/M} - 1 failures per segment each start a restart of M (e^{R/M} - 1) (failed
        # restarts included). Async's rollback past the in-flight write is re-done work, not restart.
        seg = tau_s + delta
        redo = segments * (m * math.expm1(seg / m) - seg)
        in_restart = segments * m * math.expm1(restart / m) * math.expm1(seg / m)
        proper = (inp.failures.restart_s + inp.cost.reload_s) / restart if restart > 0 else 1.0
        restart_total = in_restart * proper
        lost = redo + in_restart * (1.0 - proper)
        failures = wall / m
    young = young_interval(delta, m) if not math.isinf(m) else math.inf
    daly = daly_interval(delta, m)
    gpus = inp.n_gpus / S_PER_HOUR
    return GoodputResult(
        goodput=t_s / wall, time_to_train_s=wall, gpu_hours=wall * gpus, failure_free_time_s=t_s,
        failure_free_gpu_hours=t_s * gpus, interval_s=tau_s, interval_steps=tau_s / inp.step_s,
        interval_source=source, young_interval_s=min(young, t_s), daly_interval_s=min(daly, t_s),
        mtbf_s=m if not math.isinf(m) else 0.0, failures=failures, checkpoints=segments, checkpoint_s=ckpt_s,
        restart_s=restart_total, lost_work_s=lost, lost_per_failure_s=lost / failures if failures else 0.0,
        stall_per_checkpoint_s=delta, mode=inp.checkpoint.mode, checkpoint=inp.cost,
        assumptions=list(assumptions or []))


def whole_steps(inp: GoodputInputs, tau_s: float) -> float:
    """An interval rounded to whole optimizer steps (checkpoints are taken between steps), at least one, s."""
    return max(1, round(tau_s / inp.step_s)) * inp.step_s


def interval_of(inp: GoodputInputs) -> tuple[float, str]:
    """The checkpoint interval the spec asks for, in whole steps, s, and where it came from."""
    spec = inp.checkpoint
    if spec.interval_steps is not None:
        tau, source = spec.interval_steps * inp.step_s, f"{spec.interval_steps} steps"
    elif spec.interval == "auto":
        tau, source = auto_interval(inp)[0], "auto: Daly's optimum in whole steps"
    else:
        tau, source = float(spec.interval), "given, in whole steps"
    return min(whole_steps(inp, tau), inp.failure_free_s), source


def assumptions_of(failures: FailureSpec, checkpoint: CheckpointSpec, given: set[str]) -> list[str]:
    """Where each default the goodput rests on comes from (only the defaults the config kept)."""
    out = []
    if "per_gpu_hour" not in given:
        out.append(f"failure rate {failures.per_gpu_hour:.3g} per GPU-hour: {LLAMA3_FAILURES_SOURCE}")
    if "restart_s" not in given:
        out.append(f"restart {failures.restart_s:g} s per failure before the reload: an assumption")
    if "write_GBps_per_node" not in given:
        out.append(f"storage write {checkpoint.write_GBps_per_node:.2f} GB/s per node: Llama 3 (sec. 3.3.1) "
                   "Tectonic's sustained 2 TB/s over 2,048 nodes")
    if "read_GBps_per_node" not in given:
        out.append("storage read bandwidth = write bandwidth: an assumption")
    out.append("failures independent, exponential (Poisson); every failure stops the whole job")
    return out


def check_spec(checkpoint: CheckpointSpec | None) -> None:
    """Raise ConfigError if ``run.checkpoint`` gives both an interval in seconds and one in steps."""
    if checkpoint is not None and checkpoint.interval_steps is not None and checkpoint.interval != "auto":
        raise ConfigError(Problem("run.checkpoint.interval_steps", f"{checkpoint.interval_steps!r} given with "
                                  f"run.checkpoint.interval={checkpoint.interval!r}; give one of them"))


def build_inputs(run: RunConfig, steps: list[StepResult], failure_free_s: float, n_steps: int,
                 n_gpus: int, force: bool = False) -> tuple[GoodputInputs, list[str]] | None:
    """The goodput inputs of a run with ``run.failures`` or ``run.checkpoint`` (None with neither, unless
    ``force``: then the defaults)."""
    spec = run.run
    if spec is None or (spec.failures is None and spec.checkpoint is None and not force):
        return None
    failures = spec.failures or FailureSpec()
    ckpt = spec.checkpoint or CheckpointSpec()
    given = set(failures.model_fields_set) | set(ckpt.model_fields_set)
    cost = checkpoint_cost(run, steps, ckpt)
    inp = GoodputInputs(failure_free_s=failure_free_s, steps=max(n_steps, 1), n_gpus=n_gpus, failures=failures,
                        checkpoint=ckpt, cost=cost)
    return inp, assumptions_of(failures, ckpt, given)


def goodput(inp: GoodputInputs, assumptions: list[str] | None = None) -> GoodputResult:
    """The run's goodput at the interval its spec asks for (given, in steps, or ``auto``)."""
    tau, source = interval_of(inp)
    return goodput_at(inp, tau, source, assumptions)


def interval_sweep(inp: GoodputInputs, points: int = 13, span: float = 16.0) -> list[dict[str, Any]]:
    """Goodput over checkpoint intervals spaced geometrically from optimum / span to optimum x span, each
    in whole steps.

    Returns one row per interval (unit-suffixed keys), the (Daly) optimum's row marked ``optimum`` True.
    """
    opt = whole_steps(inp, auto_interval(inp)[0])
    lo, hi = opt / span, min(opt * span, inp.failure_free_s)
    grid = (lo * (hi / lo) ** (i / (points - 1)) for i in range(points)) if hi > lo else ()
    taus = sorted({opt, *(whole_steps(inp, t) for t in grid)})
    rows = []
    for tau in taus:
        try:
            r = goodput_at(inp, tau)
        except InfeasibleLayout:
            continue  # an interval so long that the run would never finish: no row
        rows.append({"interval_s": tau, "interval_steps": r.interval_steps, "goodput": r.goodput,
                     "time_to_train_s": r.time_to_train_s, "gpu_hours": r.gpu_hours, "checkpoints": r.checkpoints,
                     "checkpoint_s": r.checkpoint_s, "restart_s": r.restart_s, "lost_work_s": r.lost_work_s,
                     "optimum": tau == opt})
    return rows


def render_goodput(g: GoodputResult) -> list[str]:
    """Lines for ``simtrain run``'s summary."""
    h = S_PER_HOUR
    c = g.checkpoint
    mtbf = f"{g.mtbf_s / h:,.2f} h" if g.mtbf_s else "no failures"
    return [
        f"  goodput        {100 * g.goodput:.1f} % of wall time is training ({g.mode} checkpoints, MTBF {mtbf})",
        f"  effective time {g.time_to_train_s / 86400:,.2f} days, {g.gpu_hours:,.0f} GPU-hours "
        f"(failure-free {g.failure_free_time_s / 86400:,.2f} days, {g.failure_free_gpu_hours:,.0f} GPU-hours)",
        f"  checkpoint     {c.total_bytes / 1e12:,.3f} TB every {g.interval_s / 60:,.1f} min = {g.interval_steps:,.0f}"
        f" steps ({g.interval_source}; Young {g.young_interval_s / 60:,.1f} min, Daly {g.daly_interval_s / 60:,.1f}"
        f" min); stall {g.stall_per_checkpoint_s:,.1f} s each (write {c.write_s:,.1f} s, snapshot "
        f"{c.snapshot_s:,.2f} s, reload {c.reload_s:,.1f} s)",
        f"  lost time      {g.failures:,.0f} failures; checkpoints {g.checkpoint_s / h:,.1f} h, restarts "
        f"{g.restart_s / h:,.1f} h, re-done work {g.lost_work_s / h:,.1f} h ({g.lost_per_failure_s / 60:,.1f} min"
        f" per failure)",
        *(f"  assumption     {a}" for a in g.assumptions),
    ]
