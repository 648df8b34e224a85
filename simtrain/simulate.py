"""``simulate(config) -> StepResult``: the whole pipeline, one plain function per arrow.

load_config -> RankGrid + Topology -> lower() -> static memory -> Engine.run() -> StepResult.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simtrain.config import RunConfig, load_config
from simtrain.costs import ComputeCostModel
from simtrain.engine import AXES, Engine, EngineResult, RankStats, symmetry_violation
from simtrain.errors import InfeasibleLayout
from simtrain.flops import model_flops_per_step
from simtrain.hardware import ClusterSpec, Topology, build_cluster
from simtrain.layout import RankGrid
from simtrain.lowering import Lowered, lower
from simtrain.memory import closed_form_peak, static_memory
from simtrain.results import StageMemory, StepResult


def cluster_of(run: RunConfig) -> ClusterSpec:
    """The ClusterSpec a run's hardware section describes."""
    hw = run.hardware
    return build_cluster(hw.node, hw.n_nodes, gpu=hw.gpu, nics_per_node=hw.nics_per_node, nic_Gbps=hw.nic_Gbps,
                         oversubscription=hw.oversubscription, nodes_per_leaf=hw.nodes_per_leaf,
                         net_hop_latency_us=hw.net_hop_latency_us)


def _refuse_unsupported(run: RunConfig) -> None:
    lay = run.layout
    if run.hardware.profile is not None:
        raise InfeasibleLayout("hardware.profile names a calibrated profile, but calibrated profiles are not "
                               "supported yet; remove hardware.profile to use the default efficiencies",
                               profile=run.hardware.profile)
    if lay.ep > 1:
        raise InfeasibleLayout("expert parallelism (layout.ep > 1) needs MoE models, not simulated yet; "
                               "simulate with ep=1", ep=lay.ep)


def simulate(config: RunConfig | dict[str, Any] | str | Path, overrides: list[str] | None = None,
             mode: str | None = None, trace: bool = False) -> StepResult:
    """Simulate one training step.

    Args:
        config: a RunConfig, a dict, or a YAML/JSON path.
        overrides: dotted ``key=value`` overrides (as ``--set``).
        mode: "symmetric" or "full" (default: the config's ``sim.mode``).
        trace: keep every executed op for a Chrome trace.

    Raises:
        ConfigError: invalid input (every problem, with its dotted path).
        InfeasibleLayout: valid input that cannot be simulated as asked.
    """
    run = load_config(config, overrides)
    _refuse_unsupported(run)
    cluster = cluster_of(run)
    gpu = cluster.gpu
    grid = RankGrid(run.layout)
    cost = ComputeCostModel(gpu, run.train.precision)
    lowered = lower(run, cost)
    if lowered.microbatches < 1:
        raise InfeasibleLayout("fewer sequences than data-parallel ranks", microbatches=lowered.microbatches)
    _attach_static_memory(run, lowered, gpu.cuda_context_bytes + gpu.nccl_buffer_bytes)
    mode = mode or run.sim.mode
    topo = Topology(cluster)
    notes = []
    if mode == "symmetric" and (why := symmetry_violation(grid, topo)) is not None:
        mode = "full"
        notes.append(f"simulated every rank (full mode): symmetric mode needs interchangeable ranks, but {why}")
    engine = Engine(lowered.programs, grid, topo, gpu, symmetric=mode == "symmetric", trace=trace)
    res = engine.run()
    result = _result(run, mode, lowered, res, cluster, grid)
    result.notes.extend(notes)
    return result


def _attach_static_memory(run: RunConfig, lowered: Lowered, context_bytes: float) -> None:
    shard = run.layout.data_degree
    if run.layout.fsdp == "hybrid" and run.layout.fsdp_shard_size:
        shard = run.layout.fsdp_shard_size
    layer_params = run.model.layer_params() / run.layout.tp
    for s, prog in enumerate(lowered.programs):
        prog.static_mem = static_memory(lowered.stage_params[s], layer_params, sum(lowered.layers[s]), run.layout,
                                        run.train, shard, context_bytes)


def _stage_memory(run: RunConfig, lowered: Lowered, res: EngineResult, grid: RankGrid,
                  capacity: float) -> list[StageMemory]:
    frag = run.sim.fragmentation_ratio
    out = []
    for s, prog in enumerate(lowered.programs):
        ranks = [r for r in res.ranks if grid.stage_of(r) == s]
        led = max((res.ledgers[r] for r in ranks), key=lambda lg: lg.peak)
        peak = led.peak * (1 + frag)
        comps = {k: v for k, v in led.at_peak.items() if abs(v) > 0}
        comps["fragmentation"] = led.peak * frag
        closed = (sum(prog.static_mem.values()) + closed_form_peak(lowered.schedule[s], lowered.chunk_memory[s]))
        out.append(StageMemory(s, peak, comps, capacity, closed * (1 + frag), peak <= capacity, led.timeline))
    return out


def _breakdown(st: RankStats, step: float) -> dict[str, Any]:
    compute = st.busy["fwd"] + st.busy["bwd"] + st.busy["recompute"]
    exposed = {a: st.exposed.get(a, 0.0) for a in AXES}
    tail = max(step - max(st.last_compute_end_s, 0.0), 0.0)
    if tail > 0:
        axis = st.last_axis if st.last_axis in exposed else "dp"
        exposed[axis] += tail
    known = compute + st.busy["optimizer"] + sum(exposed.values()) + st.bubble_s
    return {"compute": compute, "exposed_comm": exposed, "bubble": st.bubble_s, "optimizer": st.busy["optimizer"],
            "other": max(step - known, 0.0)}


def _result(run: RunConfig, mode: str, lowered: Lowered, res: EngineResult, cluster: ClusterSpec,
            grid: RankGrid) -> StepResult:
    step = res.step_time_s
    n = cluster.n_gpus
    tokens = run.train.global_batch_seqs_resolved * run.train.seq_len
    peak = cluster.gpu.peak_flops_per_s(run.train.precision)
    model_flops = model_flops_per_step(run.model, run.train.seq_len, tokens)
    per_stage_flops = [max(res.stats[r].flops for r in res.ranks if grid.stage_of(r) == s)
                       for s in range(run.layout.pp)]
    hw_per_gpu = sum(per_stage_flops) / run.layout.pp
    critical = max(res.ranks, key=lambda r: (res.stats[r].end_s, -r))
    memory = _stage_memory(run, lowered, res, grid, cluster.gpu.hbm_bytes)
    return StepResult(
        name=run.name, mode=mode, step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / n,
        model_tflops_per_gpu=model_flops / step / n / 1e12, hardware_tflops_per_gpu=hw_per_gpu / step / 1e12,
        mfu=model_flops / (step * n * peak), hfu=hw_per_gpu / (step * peak), n_gpus=n, global_batch_tokens=tokens,
        microbatches=lowered.microbatches, breakdown_s=_breakdown(res.stats[critical], step), memory=memory,
        fits=all(m.fits for m in memory), layout=run.layout.model_dump(mode="json"),
        ops_executed=res.ops_executed, trace=res.trace, stage_of={r: grid.stage_of(r) for r in res.ranks},
    )
