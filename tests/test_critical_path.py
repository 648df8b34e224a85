"""The critical-path evaluator (``simtrain.engine.critical_path``) against closed forms and the engine."""

from __future__ import annotations

from typing import Any

import pytest
from test_steady import TINY_MOE
from test_symmetric_full import TINY
from test_symmetric_roles import SMALL, _small

import simtrain.cost.host as host
from simtrain.engine.critical_path import _Setup, evaluate, evaluate_run
from simtrain.engine.engine import Engine
from simtrain.hardware.load import build_cluster
from simtrain.hardware.topology import Topology
from simtrain.lower.ops import OpKind, Program, Stream
from simtrain.plan.layout import RankGrid
from simtrain.plan.load import load_config
from simtrain.plan.schedules import build_schedule
from simtrain.spec.collective_kinds import ALL_REDUCE
from simtrain.spec.config import LayoutConfig
from simtrain.studies.simulate import simulate

TF, TB = 1.0, 2.0


def _fabric(p: int = 1, dp: int | None = None) -> tuple[RankGrid, Topology, Any]:
    cl = build_cluster("dgx-h100", 1)
    return RankGrid(LayoutConfig(pp=p, dp=dp or 8 // p)), Topology(cl), cl.gpu


def _pipeline(kind: str, p: int, m: int) -> list[Program]:
    """One compute op per action (F: TF, B: TB); a receive is a remote dependency on the sender's
    compute op itself (a free send)."""
    sched = build_schedule(kind, p, m)
    progs = [Program(s) for s in range(p)]
    idx: dict[tuple[int, str, int], int] = {}
    for s in range(p):
        for a in sched[s]:
            op = progs[s].add(OpKind.COMPUTE, Stream.COMPUTE, f"{a.kind}{a.microbatch}",
                              category="fwd" if a.kind == "F" else "bwd", duration_s=TF if a.kind == "F" else TB)
            idx[(s, a.kind, a.microbatch)] = op.idx
    for s in range(p):
        for a in sched[s]:
            src = s - 1 if a.kind == "F" else s + 1
            if 0 <= src < p:
                progs[s].ops[idx[(s, a.kind, a.microbatch)]].remote = (src, idx[(src, a.kind, a.microbatch)])
    return progs


def test_one_stage_without_communication_takes_the_sum_of_its_compute() -> None:
    prog = Program(0)
    times = [0.25, 1.5, 0.125, 3.0, 0.0625]
    for i, t in enumerate(times):
        prog.add(OpKind.COMPUTE, Stream.COMPUTE, f"op{i}", category="fwd" if i < 3 else "bwd", duration_s=t)
    res = evaluate([prog], *_fabric())
    assert res.step_time_s == pytest.approx(sum(times), rel=1e-12)
    st = res.stages[0]
    assert st.busy_s["fwd"] == pytest.approx(sum(times[:3])) and st.busy_s["bwd"] == pytest.approx(sum(times[3:]))
    assert st.idle_s(res.step_time_s) == pytest.approx(0.0, abs=1e-12) and st.bubble_s == 0.0


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (8, 16)])
def test_pipeline_step_is_the_textbook_closed_form(kind: str, p: int, m: int) -> None:
    """Equal stage times and free sends: (m + p - 1)(t_f + t_b) for 1F1B and GPipe alike
    (Narayanan et al. 2021, Sec. 2.2.1: the bubble is (p - 1)(t_f + t_b))."""
    res = evaluate(_pipeline(kind, p, m), *_fabric(p))
    assert res.step_time_s == pytest.approx((m + p - 1) * (TF + TB), rel=1e-12)
    for st in res.stages:  # every stage computes m (t_f + t_b) and idles the bubble
        assert st.compute_s == pytest.approx(m * (TF + TB))
        assert st.idle_s(res.step_time_s) == pytest.approx((p - 1) * (TF + TB))


def _allreduce_program(window_s: float) -> Program:
    """B1, then a gradient all-reduce on the DP stream beside the rest of the backward (``window_s``),
    then the optimizer, which waits for the all-reduce."""
    prog = Program(0)
    b1 = prog.add(OpKind.COMPUTE, Stream.COMPUTE, "B1", category="bwd", duration_s=0.5)
    ar = prog.add(OpKind.COLLECTIVE, Stream.DP, "grad_ar", category="comm", deps=(b1.idx,), coll=ALL_REDUCE,
                  axis="dp", comm_bytes=4e9)
    prog.add(OpKind.COMPUTE, Stream.COMPUTE, "B2", category="bwd", duration_s=window_s)
    prog.add(OpKind.COMPUTE, Stream.COMPUTE, "opt", category="optimizer", deps=(ar.idx,), duration_s=0.25)
    return prog


def test_overlapped_dp_all_reduce_exposes_what_the_backward_does_not_hide() -> None:
    grid, topo, gpu = _fabric()
    alone = Program(0)
    alone.add(OpKind.COLLECTIVE, Stream.DP, "grad_ar", category="comm", coll=ALL_REDUCE, axis="dp", comm_bytes=4e9)
    t_ar = evaluate([alone], grid, topo, gpu).step_time_s
    assert t_ar > 0.01
    for window in (0.2 * t_ar, 0.9 * t_ar, 1.5 * t_ar):
        res = evaluate([_allreduce_program(window)], grid, topo, gpu)
        exposed = max(0.0, t_ar - window)
        assert res.breakdown_s()["exposed_comm"]["dp"] == pytest.approx(exposed, rel=1e-9, abs=1e-12)
        assert res.step_time_s == pytest.approx(0.5 + window + exposed + 0.25, rel=1e-12)


@pytest.mark.parametrize("window", [0.01, 0.05, 0.5])
def test_overlapped_all_reduce_equals_the_engine_without_interference(window: float) -> None:
    """With the compute slow-down of a collective in flight off (the one contention effect on one
    rank), the engine runs the all-reduce in the time of its plan alone, as the evaluator does."""
    grid, topo, gpu = _fabric()
    gpu = gpu.model_copy(update={"comm_interference_nvlink": 0.0, "comm_interference_net": 0.0,
                                 "comm_interference_p2p": 0.0})
    eng = Engine([_allreduce_program(window)], grid, topo, gpu).run()
    res = evaluate([_allreduce_program(window)], grid, topo, gpu)
    assert res.step_time_s == pytest.approx(eng.step_time_s, rel=1e-12)
    assert res.stages[0].exposed_s["dp"] == pytest.approx(eng.stats[0].exposed["dp"], rel=1e-9, abs=1e-15)


def _tiny(layout: dict[str, Any], nodes: int, seqs: int, model: dict[str, Any] = TINY) -> dict[str, Any]:
    return dict(model=model, hardware=dict(n_nodes=nodes), layout=layout,
                train=dict(seq_len=512, global_batch_seqs=seqs))


NO_SHARED_LINK = {
    "tp8": _tiny(dict(tp=8), 1, 4),
    "tp8-full-recompute": _tiny(dict(tp=8, recompute="full"), 1, 4),
    # 40 MiB buckets: several gradient all-reduces on the DP stream (Megatron's default, 40M parameters,
    # would make this tiny model's gradients one bucket, reduced in line after the backward)
    "dp8": _tiny(dict(dp=8, grad_bucket_MiB=40), 1, 16),
    # MoE, experts over the node's 8 GPUs, the hottest expert taking 3x the mean: the routed-expert
    # kernels of the simulated (hottest) rank run 3x longer in both evaluators (simtrain.plan.routing)
    "moe-ep8-skewed": {**_tiny(dict(dp=8, ep=8), 1, 16, TINY_MOE),
                       "train": dict(seq_len=512, global_batch_seqs=16, moe_routing="skewed", moe_hot_expert_load=3.0)},
}


@pytest.mark.parametrize("name", list(NO_SHARED_LINK))
def test_equals_the_engine_where_no_two_flows_share_a_link(name: str) -> None:
    """Single-node TP (every collective blocking, alone on its NVLink ports) and plain DP (one
    all-reduce at a time on its stream): the engine has nothing to contend, so the times and the
    ledger peak are the same."""
    cfg = NO_SHARED_LINK[name]
    eng = simulate(cfg, overrides=["sim.steady_state=false"])
    res = evaluate_run(cfg, steady_state=False)
    assert res.step_time_s == pytest.approx(eng.step_time_s, rel=1e-9)
    frag = 1 + 0.05  # sim.fragmentation_ratio's default
    for st, mem in zip(res.stages, eng.memory, strict=True):
        assert st.peak_bytes * frag == pytest.approx(mem.peak_bytes, rel=1e-9)
    # the engine stretches a compute op a collective overlaps (GpuSpec.comm_interference_*), which moves
    # time from exposed communication to compute when the collective is the longer: the sum is the same
    mine, its = res.breakdown_s(), eng.breakdown_s
    assert mine["compute"] <= its["compute"] * (1 + 1e-9)
    assert mine["compute"] + sum(mine["exposed_comm"].values()) == pytest.approx(
        its["compute"] + sum(its["exposed_comm"].values()), rel=1e-9)


@pytest.mark.parametrize("layout", [dict(tp=4, pp=2), dict(pp=4, dp=2), dict(pp=2, vpp=2, tp=2, dp=2)])
def test_pipelines_within_a_fraction_of_a_percent_of_the_engine(layout: dict[str, Any]) -> None:
    """Pipelines differ from the engine only by the compute slow-down a send in flight causes
    (one SM's share, ``GpuSpec.comm_interference_p2p``); memory peaks are equal."""
    cfg = _tiny(layout, 1, 8 * layout.get("dp", 1))
    eng = simulate(cfg, overrides=["sim.steady_state=false"])
    res = evaluate_run(cfg, steady_state=False)
    assert res.step_time_s <= eng.step_time_s * (1 + 1e-9)
    assert res.step_time_s == pytest.approx(eng.step_time_s, rel=3e-3)
    for st, mem in zip(res.stages, eng.memory, strict=True):
        assert st.peak_bytes * 1.05 == pytest.approx(mem.peak_bytes, rel=1e-9)


def test_routed_load_slows_the_hottest_rank() -> None:
    skewed = NO_SHARED_LINK["moe-ep8-skewed"]
    balanced = {**skewed, "train": dict(seq_len=512, global_batch_seqs=16)}
    assert evaluate_run(skewed).step_time_s > evaluate_run(balanced).step_time_s * 1.05


def test_steady_state_extension_equals_every_micro_batch() -> None:
    cfg = _tiny(dict(pp=2, tp=2, dp=2), 1, 80)
    full = evaluate_run(cfg, steady_state=False)
    short = evaluate_run(cfg, steady_state=True)
    assert short.note.startswith("steady state") and full.note.startswith("every")
    assert short.ops_evaluated < full.ops_evaluated
    assert short.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert short.peak_bytes == pytest.approx(full.peak_bytes, rel=1e-9)
    for a, b in zip(short.stages, full.stages, strict=True):
        assert a.compute_s == pytest.approx(b.compute_s, rel=1e-9)
        assert a.bubble_s == pytest.approx(b.bubble_s, rel=1e-6, abs=1e-12)


def test_deterministic() -> None:
    cfg = _tiny(dict(pp=2, tp=2, dp=2, zero_stage=1), 1, 16)
    assert repr(evaluate_run(cfg)) == repr(evaluate_run(cfg))


def test_a_dependency_cycle_is_an_error_not_a_hang() -> None:
    prog = Program(0)
    a = prog.add(OpKind.COMPUTE, Stream.COMPUTE, "a", duration_s=1.0)
    b = prog.add(OpKind.COLLECTIVE, Stream.DP, "b", deps=(1,), coll=ALL_REDUCE, axis="dp", comm_bytes=1.0)
    prog.ops[a.idx].deps = (b.idx,)
    with pytest.raises(ValueError, match="cycle"):
        evaluate([prog], *_fabric())


@pytest.mark.parametrize("name", ["tp8", "tp8-full-recompute", "dp8"])  # each has comm-stream collectives
def test_in_situ_slowdown_is_left_out_as_a_lower_bound_of_the_engine(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A calibrated ``comm_in_situ_slowdown`` lengthens a comm-stream collective in the engine by the compute
    that ran beside it, which this evaluator does not know when it places the op: it leaves the stretch out
    (its times do not move) and stays at or below the engine, which the stretch slows. (Without the CPU
    time of the collective calls: these tiny models' steps are bound by it, which hides the comm stream's
    collectives.)"""
    monkeypatch.setattr(host, "C10D_COLLECTIVE_CPU_S", 0.0)
    run = load_config(NO_SHARED_LINK[name])
    setup = _Setup.of(run)
    low = setup.lowered(run)
    base = evaluate(low.programs, setup.grid, setup.topo, setup.cluster.gpu).step_time_s
    gpu = setup.cluster.gpu.model_copy(update={"comm_in_situ_slowdown": 0.4})
    plain = Engine(low.programs, setup.grid, setup.topo, setup.cluster.gpu).run().step_time_s
    eng = Engine(low.programs, setup.grid, setup.topo, gpu).run()
    res = evaluate(low.programs, setup.grid, setup.topo, gpu)
    assert res.step_time_s == base
    assert eng.step_time_s > plain * (1 + 1e-3) and res.step_time_s <= eng.step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("name", ["6g-tp2-cp2-pp2", "6g-tp-outermost"])
def test_roles_are_evaluated_and_the_slowest_sets_the_step(name: str) -> None:
    """Groups that do not tile the nodes: one evaluation per role (``simtrain.plan.roles``), as the engine's
    symmetric mode runs them; no contention in these two, so the steps agree closely, peaks exactly."""
    cfg = _small(*SMALL[name])
    eng = simulate(cfg)
    res = evaluate_run(cfg)
    assert any("roles" in n for n in eng.notes)
    assert res.step_time_s <= eng.step_time_s * (1 + 1e-9)
    assert res.step_time_s == pytest.approx(eng.step_time_s, rel=1e-4)
    assert res.peak_bytes * 1.05 == pytest.approx(max(m.peak_bytes for m in eng.memory), rel=1e-9)
