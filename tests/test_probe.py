"""The search's evaluator (``simtrain.engine.probe``): closed forms, its own shortcuts against the long
way, and the critical-path evaluator of the whole program."""

from __future__ import annotations

import random
from typing import Any

import pytest
from test_search import SMALL

import simtrain.engine.probe as probe
from simtrain.engine.critical_path import evaluate, evaluate_run
from simtrain.engine.probe import LineComm, probe_actions
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology
from simtrain.lower.ops import OpKind, Program, Stream
from simtrain.plan.layout import RankGrid
from simtrain.plan.load import load_config
from simtrain.plan.schedules import SCHEDULES, Action, ActionCosts, makespan, schedule_of
from simtrain.plan.schedules.timing import compile_schedule
from simtrain.spec.collective_kinds import ALL_GATHER, REDUCE_SCATTER
from simtrain.spec.config import LayoutConfig
from simtrain.studies.estimate import Estimator
from simtrain.studies.simulate import cluster_of

SHAPES = {"gpipe": (3, 5, 1), "1f1b": (4, 8, 1), "interleaved_1f1b": (4, 8, 2), "zb_h1": (4, 8, 1),
          "dualpipe": (4, 16, 1), "dualpipev": (4, 8, 1)}


@pytest.mark.parametrize("kind", [str(k) for k in SCHEDULES])
def test_a_compiled_schedule_times_like_makespan(kind: str) -> None:
    """``compile_schedule(...).stage_ends`` is ``makespan``'s stage ends, for every schedule, with uneven
    random F/B/W/F&B/p2p costs per (stage, chunk)."""
    p, m, v = SHAPES[kind]
    sched = schedule_of(kind)
    acts, route = sched.actions(p, m, v), sched.route(p, m, v)
    chunks = 1 + max(a.chunk for row in acts for a in row)
    rnd = random.Random(7)
    costs = [[ActionCosts(rnd.random(), rnd.random(), rnd.random(),
                          2 * rnd.random() if sched.overlaps_forward_backward else None, 0.1 * rnd.random())
              for _ in range(chunks)] for _ in range(p)]
    want = makespan(acts, lambda s, c: costs[s][c], route).stage_end_s
    assert compile_schedule(acts, route).stage_ends(costs) == pytest.approx(want, rel=1e-12)


def test_probe_actions_keep_each_chunks_first_micro_batch_in_order() -> None:
    acts = schedule_of("dualpipe").actions(4, 16, 1)[0]
    got = probe_actions(acts)
    assert [(a.kind, a.chunk) for a in got if a.kind == "F"] == [("F", 0), ("F", 1)]
    assert all(not a.overlap_with_next for a in got)
    firsts = {a.chunk: a.microbatch for a in got}
    assert all(a.microbatch == firsts[a.chunk] for a in got)
    assert {a.kind for a in got} <= {"F", "B", "W"} and Action("F", 0, 0) in got


@pytest.mark.parametrize("overrides", [
    ["layout.tp=2", "layout.dp=4", "layout.pp=2", "layout.sequence_parallel=true", "layout.zero_stage=1"],
    ["layout.tp=2", "layout.dp=4", "layout.pp=2", "layout.recompute=full", "layout.recompute_layers=2"],
    ["layout.tp=2", "layout.dp=4", "layout.pp=2", "layout.vpp=2", "layout.zero_stage=3"],
    ["layout.dp=16", "layout.zero_stage=0"],
])
def test_a_truncated_probe_extrapolates_exactly(overrides: list[str]) -> None:
    """Every quantity of an uncontended probe is linear in the layers of each kind (recomputed, plain),
    so probes of 3 and 2 layers per kind extrapolate to the whole stage: the same step as probing every
    layer (16 layers, partial recompute included), but for the ZeRO-1/2 parameter gathers before the
    first forward, bucketed (one collective latency and one call's CPU time more per bucket, not per layer:
    within 2e-3)."""
    run = load_config({**SMALL, "model": {"preset": "llama3-8b", "n_layers": 16}}, overrides)
    est = Estimator(run.model, cluster_of(run), 0.05)
    short = est.estimate(run.layout, run.train)
    old = probe.TRUNCATED_LAYERS
    try:
        probe.TRUNCATED_LAYERS = 100
        whole = Estimator(run.model, cluster_of(run), 0.05).estimate(run.layout, run.train)
    finally:
        probe.TRUNCATED_LAYERS = old
    rel = 2e-3 if run.layout.shard_stage in (1, 2) else 1e-9
    assert short.step_time_s == pytest.approx(whole.step_time_s, rel=rel)
    assert short.components() == pytest.approx(whole.components(), rel=rel, abs=rel * whole.step_time_s)


@pytest.mark.parametrize("overrides", [
    [],
    ["layout.tp=2", "layout.dp=2", "layout.pp=2", "layout.sequence_parallel=true", "layout.zero_stage=1"],
    ["layout.tp=4", "layout.pp=2", "layout.dp=1", "layout.zero_stage=0"],
])
def test_the_probe_is_the_whole_program_on_one_node(overrides: list[str]) -> None:
    """On one DGX H100 (no two stages' flows meet on a link, so the critical path has no contention to
    leave out) the probe's step is the critical-path evaluation of the whole lowered program to 0.5 %:
    they differ only where micro-batches of the real pipeline overlap in ways the probe's per-action
    costs do not see."""
    cfg: dict[str, Any] = {**SMALL, "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"tp": 1, "dp": 8},
                           "train": {"seq_len": 2048, "global_batch_seqs": 32}}
    run = load_config(cfg, overrides)
    e = Estimator(run.model, cluster_of(run), 0.05).estimate(run.layout, run.train)
    cp = evaluate_run(run, steady_state=False)
    assert e.step_time_s == pytest.approx(cp.step_time_s, rel=5e-3)


def _two_streams(window: float | None) -> list[Program]:
    """A parameter all-gather and a gradient reduce-scatter of equal size on two DP streams from time
    0 (``window`` None), or the reduce-scatter only after a compute op of ``window`` seconds."""
    prog = Program(0)
    deps: tuple[int, ...] = ()
    if window is not None:
        deps = (prog.add(OpKind.COMPUTE, Stream.COMPUTE, "c", category="bwd", duration_s=window).idx,)
    prog.add(OpKind.COLLECTIVE, Stream.DP_GATHER, "ag", category="comm", coll=ALL_GATHER, axis="dp",
             comm_bytes=2e9)
    prog.add(OpKind.COLLECTIVE, Stream.DP, "rs", category="comm", deps=deps, coll=REDUCE_SCATTER, axis="dp",
             comm_bytes=2e9)
    return [prog]


def test_a_ranks_own_streams_share_its_nic() -> None:
    """Two collectives of one rank over the network on two streams at once take the sum of their
    times (the bytes of both go through the one NIC); started apart, each takes its own; on NVLink
    only (no NIC), they do not share."""
    cl = build_cluster("dgx-h100", 2)
    topo = Topology(cl)
    grid = RankGrid(LayoutConfig(tp=8, dp=2))  # dp groups span the two nodes
    comm = LineComm(topo, cl.gpu)
    comm.bind(grid, [0])
    ag = Program(0)
    ag.add(OpKind.COLLECTIVE, Stream.DP_GATHER, "ag", category="comm", coll=ALL_GATHER, axis="dp", comm_bytes=2e9)
    t_ag = evaluate([ag], grid, topo, cl.gpu, comm=comm).step_time_s
    rs = Program(0)
    rs.add(OpKind.COLLECTIVE, Stream.DP, "rs", category="comm", coll=REDUCE_SCATTER, axis="dp", comm_bytes=2e9)
    t_rs = evaluate([rs], grid, topo, cl.gpu, comm=comm).step_time_s
    assert t_ag > 1e-3 and t_ag == pytest.approx(t_rs, rel=1e-9)  # ring: (n - 1)/n of the bytes each
    both = evaluate(_two_streams(None), grid, topo, cl.gpu, comm=comm, share_nic=True).step_time_s
    assert both == pytest.approx(t_ag + t_rs, rel=1e-12)
    unshared = evaluate(_two_streams(None), grid, topo, cl.gpu, comm=comm).step_time_s
    assert unshared == pytest.approx(max(t_ag, t_rs), rel=1e-12)
    apart = evaluate(_two_streams(t_ag), grid, topo, cl.gpu, comm=comm, share_nic=True).step_time_s
    assert apart == pytest.approx(t_ag + t_rs, rel=1e-12)  # the reduce-scatter starts as the gather ends
    one_node = RankGrid(LayoutConfig(tp=1, dp=8))
    cl1 = build_cluster("dgx-h100", 1)
    topo1 = Topology(cl1)
    comm1 = LineComm(topo1, cl1.gpu)
    comm1.bind(one_node, [0])
    t1 = evaluate(_two_streams(None), one_node, topo1, cl1.gpu, comm=comm1, share_nic=True).step_time_s
    t1_alone = evaluate(_two_streams(None), one_node, topo1, cl1.gpu, comm=comm1).step_time_s
    assert t1 == pytest.approx(t1_alone, rel=1e-12)


def test_engine_does_not_import_studies() -> None:
    """engine/ (both evaluators) comes before studies/ in the dataflow: no module of it imports one of
    studies/ (critical_path used studies.simulate's private helpers; they live in engine.prepare)."""
    from test_architecture import import_graph

    graph = import_graph()
    bad = [(a, b) for a, b in graph.edges if a.startswith("simtrain.engine.") and b.startswith("simtrain.studies.")
           and a != "simtrain.engine.results"]  # results' ErrorBand import is type-only
    assert bad == []
