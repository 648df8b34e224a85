"""Layout search (simtrain.studies.search) and its estimate (simtrain.studies.estimate, via simtrain.engine.probe)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simtrain.cli.main import main
from simtrain.lower.memory import ChunkMemory, closed_form_peak
from simtrain.plan.load import load_config
from simtrain.plan.schedules import build_schedule
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError
from simtrain.studies.estimate import Estimator, single_chunk_peak
from simtrain.studies.search import (
    CAUSE,
    Candidate,
    SearchSpace,
    _point,
    _sim_components,
    _why,
    enumerate_layouts,
    search,
)
from simtrain.studies.search_render import render_search
from simtrain.studies.simulate import cluster_of, simulate
from simtrain.studies.sweep import base_data, run_points

SMALL: dict[str, Any] = {
    "name": "search-test", "model": {"preset": "llama3-8b", "n_layers": 8},
    "hardware": {"node": "dgx-h100", "n_nodes": 2}, "layout": {"tp": 1, "dp": 16},
    "train": {"seq_len": 2048, "global_batch_seqs": 64},
}


def _assert_estimate_matches_engine(run: RunConfig, step_rel: float) -> None:
    """Per-stage peak memory of the closed-form estimate equal to the engine's; step time within
    ``step_rel`` of it."""
    e = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio).estimate(run.layout, run.train)
    r = simulate(run)
    assert list(e.stage_peak_bytes) == pytest.approx([m.peak_bytes for m in r.memory], rel=1e-9)
    assert e.step_time_s == pytest.approx(r.step_time_s, rel=step_rel)


@pytest.mark.parametrize("overrides", [
    [],
    ["layout.tp=2", "layout.dp=4", "layout.pp=2", "layout.sequence_parallel=true", "layout.zero_stage=1"],
    ["layout.tp=2", "layout.dp=2", "layout.pp=4", "layout.vpp=2", "layout.zero_stage=2", "layout.recompute=full",
     "layout.recompute_layers=1"],
    ["layout.tp=4", "layout.dp=2", "layout.cp=2", "layout.zero_stage=3", "train.micro_batch_size=2"],
    ["layout.pp=8", "layout.dp=2", "train.attention_kernel=unfused", "layout.recompute=selective"],
    # torchtitan keeps each pipeline stage's parameters unsharded for the step (one gather, one reduce-scatter)
    ["layout.pp=2", "layout.dp=8", "layout.zero_stage=3", "train.stack=torchtitan-compile"],
    # DeepSpeed's pipeline engine: fp32 gradient all-reduce after the flush, parameter gather after the step
    ["layout.pp=2", "layout.dp=8", "layout.zero_stage=1", "train.stack=deepspeed"],
    # torch pipelining's per-micro-batch buffers on interleaved stages, loss_parallel's eager backward
    ["layout.tp=2", "layout.pp=2", "layout.vpp=2", "layout.dp=4", "layout.zero_stage=3",
     "layout.sequence_parallel=true", "train.stack=torchtitan-compile-2024"],
])
def test_estimate_memory_equals_the_engine(overrides: list[str]) -> None:
    """Per-stage peak memory of the closed form equals the simulated ledger's, stage by stage."""
    run = load_config(SMALL, overrides)
    _assert_estimate_matches_engine(run, step_rel=0.25)


# Mixtral 8x7B cut to 4 layers on 2 DGX H100 (16 GPUs); DeepSeek-V3 cut to 4 layers (1 dense + 3 MoE, MLA,
# 256 experts, group-limited routing) on 4 HGX H800 nodes; GPT-OSS 120B cut to 4 layers (sliding/full
# attention, 128 experts); Llama 3 8B with alternating 512-token windows.
MOE: dict[str, Any] = {
    "name": "moe-test", "model": {"preset": "mixtral-8x7b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 2}, "layout": {"tp": 1, "dp": 16, "ep": 8},
    "train": {"seq_len": 2048, "global_batch_seqs": 64},
}
DSV3: dict[str, Any] = {
    "name": "dsv3-test", "model": {"preset": "deepseek-v3", "n_layers": 4, "mtp_depth": 0},
    "hardware": {"node": "hgx-h800", "n_nodes": 4}, "layout": {"tp": 1, "dp": 32, "ep": 32, "zero_stage": 1},
    "train": {"seq_len": 2048, "global_batch_seqs": 64},
}
GPT_OSS: dict[str, Any] = {**MOE, "model": {"preset": "gpt-oss-120b", "n_layers": 4}}
WINDOWED: dict[str, Any] = {**SMALL, "model": {"preset": "llama3-8b", "n_layers": 8, "sliding_window": 512,
                                               "attention_pattern": ["sliding", "full"]}}


@pytest.mark.parametrize(("cfg", "overrides"), [
    (MOE, []),
    (MOE, ["layout.tp=2", "layout.dp=8", "layout.sequence_parallel=true", "layout.etp=1", "layout.zero_stage=1"]),
    (MOE, ["layout.tp=2", "layout.dp=8", "layout.sequence_parallel=true", "layout.ep=4", "layout.cp=1"]),
    (MOE, ["layout.pp=2", "layout.vpp=2", "layout.dp=8", "layout.ep=2", "layout.recompute=full"]),
    (MOE, ["layout.pp=2", "layout.dp=8", "layout.schedule=dualpipe", "layout.zero_stage=1"]),
    (MOE, ["layout.pp=2", "layout.dp=8", "layout.schedule=zb_h1", "layout.zero_stage=2"]),
    (MOE, ["layout.cp=2", "layout.dp=8", "train.moe_routing=skewed", "train.moe_hot_expert_load=2"]),
    (DSV3, []),
    (DSV3, ["layout.pp=2", "layout.dp=16", "layout.ep=16", "layout.schedule=dualpipe", "train.precision=fp8",
            "train.fp8_recipe=blockwise", "layout.recompute=selective",
            "layout.recompute_modules=[layernorm,mla_up_proj,act]"]),
    (GPT_OSS, ["layout.pp=2", "layout.dp=8", "layout.zero_stage=1"]),
    (WINDOWED, ["layout.tp=2", "layout.dp=8", "layout.sequence_parallel=true", "layout.zero_stage=2"]),
    (WINDOWED, ["layout.pp=2", "layout.dp=8", "layout.recompute=full"]),
])
def test_estimate_of_moe_and_windowed_models(cfg: dict[str, Any], overrides: list[str]) -> None:
    """MoE (EP/ETP, dispatch/combine within and across nodes, group-limited routing, skewed load,
    DualPipe, ZB-H1, FP8) and sliding-window layers: the closed form's per-stage memory equals the
    engine's and its step time is within 25 % of the simulated one."""
    run = load_config(cfg, overrides)
    _assert_estimate_matches_engine(run, step_rel=0.25)


@pytest.mark.parametrize(("cfg", "overrides"), [
    (MOE, ["layout.zero_stage=3"]),  # edp 2 across the two nodes
    (MOE, ["layout.zero_stage=3", "layout.ep=2", "train.global_batch_seqs=256"]),  # edp 8, 16 micro-batches
    (MOE, ["layout.zero_stage=3", "layout.tp=2", "layout.dp=8", "layout.sequence_parallel=true", "layout.etp=1",
           "layout.ep=4"]),
    (MOE, ["layout.zero_stage=3", "layout.fsdp_prefetch_layers=0"]),
    (MOE, ["layout.zero_stage=3", "layout.pp=2", "layout.dp=8", "layout.ep=4", "layout.schedule=dualpipe"]),
    (DSV3, ["layout.zero_stage=3", "layout.ep=8"]),  # 1 dense + 3 MoE layers, edp 4 across nodes
    (GPT_OSS, ["layout.zero_stage=3", "layout.ep=4", "layout.recompute=full"]),
])
def test_estimate_of_zero3_with_experts(cfg: dict[str, Any], overrides: list[str]) -> None:
    """ZeRO-3 with MoE: lowering gathers each layer's routed experts and reduce-scatters their gradients
    over the expert-data-parallel group beside the dense part over dp; the estimate prices both and its
    memory equals the engine's. Its step is within 30 % of the engine's (measured 7-24 % low): the
    gathers of a node's ranks share its NICs, which only the engine's flows model (the estimate shares
    a rank's NIC between its own streams only, ``critical_path.evaluate(share_nic=True)``)."""
    run = load_config(cfg, overrides)
    _assert_estimate_matches_engine(run, step_rel=0.30)


def test_enumerated_moe_layouts_are_valid() -> None:
    """EP (divisors of the experts, ep x etp dividing tp x cp x dp), ETP 1 or TP, DualPipe and DualPipeV
    where they can run, ZeRO 0-3; every layout passes validation."""
    run = load_config(MOE)
    layouts = enumerate_layouts(run, 16, SearchSpace(cp=(1,), micro_batch_size=(1,), recompute=("none",)))
    seen = {(lay.ep, lay.etp, lay.schedule) for lay, _ in layouts}
    assert {ep for ep, _, _ in seen} == {1, 2, 4, 8} and {etp for _, etp, _ in seen} == {1, 2, 4, 8}
    assert all(lay.etp in (1, lay.tp) for lay, _ in layouts)
    assert {s for _, _, s in seen} == {"auto", "dualpipe", "dualpipev"}
    assert {lay.zero_stage for lay, _ in layouts} == {0, 1, 2, 3}
    for lay, train in layouts[::5]:
        ok = load_config({**MOE, "layout": lay.model_dump(), "train": train.model_dump()})  # raises if invalid
        assert ok.layout.world_size == 16 and (ok.layout.tp == 1 or ok.layout.sequence_parallel)


def test_moe_search_enumerates_dualpipev() -> None:
    """DualPipeV (pp ranks, 2 x pp stages in a V) is tried for MoE models wherever it can run: any pp > 1
    with at least 2 x pp micro-batches and a layer on each of its 2 x pp stages, vpp 1 (odd pp and odd
    micro-batch counts too, which DualPipe refuses); every such layout is valid."""
    cfg = {**MOE, "model": {"preset": "mixtral-8x7b", "n_layers": 6}, "train": {"seq_len": 2048,
                                                                                 "global_batch_seqs": 48}}
    run = load_config(cfg)
    space = SearchSpace(tp=(1,), cp=(1,), micro_batch_size=(1,), zero_stage=(1,), recompute=("none",), ep=(2,))
    layouts = enumerate_layouts(run, 16, space)
    v = [(lay, tr) for lay, tr in layouts if lay.schedule == "dualpipev"]
    dual = {(lay.pp, lay.dp) for lay, _ in layouts if lay.schedule == "dualpipe"}
    assert {(lay.pp, lay.dp) for lay, _ in v} == {(2, 8)}  # pp 4: 8 stages > 6 layers; pp 8, 16: too few
    assert dual == {(2, 8), (4, 4)} and all(lay.vpp == 1 for lay, _ in v)
    odd = enumerate_layouts(load_config({**cfg, "hardware": {"node": "dgx-h100", "n_nodes": 3}},
                                        ["layout.dp=24"]), 24, space)
    assert {lay.pp for lay, _ in odd if lay.schedule == "dualpipev"} == {2, 3}  # pp 3: DualPipeV only
    assert {lay.pp for lay, _ in odd if lay.schedule == "dualpipe"} == {2, 4, 6}
    for lay, train in v:
        load_config({**cfg, "layout": lay.model_dump(), "train": train.model_dump()})  # raises if invalid
    assert "dualpipev" not in {lay.schedule for lay, _ in enumerate_layouts(load_config(SMALL), 16, SearchSpace())}
    r = search(MOE, space=SearchSpace(tp=(1,), pp=(2,), cp=(1,), micro_batch_size=(1,), zero_stage=(1,),
                                      recompute=("none",), ep=(4,), schedule=("dualpipev",)), top_k=1, workers=1)
    assert r.best is not None and r.best.label().endswith("dualpipev") and r.best.fits


@pytest.mark.parametrize(("cfg", "overrides"), [
    (MOE, ["layout.pp=2", "layout.dp=8", "layout.ep=4", "layout.schedule=dualpipev", "train.global_batch_seqs=128"]),
    ({**MOE, "model": {"preset": "mixtral-8x7b", "n_layers": 8}},
     ["layout.pp=4", "layout.dp=4", "layout.ep=4", "layout.schedule=dualpipev", "train.global_batch_seqs=36"]),
    ({**MOE, "model": {"preset": "mixtral-8x7b", "n_layers": 8}},
     ["layout.pp=2", "layout.dp=8", "layout.ep=8", "layout.schedule=dualpipev", "layout.zero_stage=3"]),
])
def test_estimate_of_dualpipev(cfg: dict[str, Any], overrides: list[str]) -> None:
    """DualPipeV: the executed schedule's makespan with the V's two chunks per rank (each running every
    micro-batch) is within 15 % of the engine's step (measured within 3 %), and its memory (one copy
    of the parameters: 2 x pp stages of n_layers / (2 x pp) layers) equals the engine's closed form
    (the ledger interleaves an overlapped pair's ops more finely: within 1 %)."""
    run = load_config(cfg, overrides)
    est = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio)
    e = est.estimate(run.layout, run.train)
    r = simulate(run)
    assert list(e.stage_peak_bytes) == pytest.approx([m.closed_form_peak_bytes for m in r.memory], rel=1e-9)
    assert list(e.stage_peak_bytes) == pytest.approx([m.peak_bytes for m in r.memory], rel=0.02)
    assert e.step_time_s == pytest.approx(r.step_time_s, rel=0.15)
    assert sum(sum(row) for row in est.chunk_layers(run.layout)) == run.model.n_layers


def test_moe_search_matches_exhaustive_simulation() -> None:
    """Mixtral cut to 4 layers on 16 H100: the best layout search simulates (top 4 estimates) is within
    1 % of the best that simulating every fitting layout of the space finds (TP 1/2, PP 1/2/4, every
    EP and ETP, 1F1B/interleaved/DualPipe, ZeRO-1, micro-batch 1)."""
    space = SearchSpace(tp=(1, 2), pp=(1, 2, 4), cp=(1,), micro_batch_size=(1,), zero_stage=(1,),
                        recompute=("none",))
    r = search(MOE, space=space, top_k=4, workers=2)
    assert r.best is not None
    fitting = [c for c in r.candidates if c.status in ("best", "simulated", "estimated")]
    assert len(fitting) > 30 and len({c.layout["ep"] for c in fitting}) == 4
    rows = run_points(base_data(MOE), [_point(c) for c in fitting], workers=2)
    assert all(row["error"] is None for row in rows)
    exhaustive = min(row["step_time_s"] for row in rows if row["fits"])
    assert r.best.step_time_s == pytest.approx(exhaustive, rel=0.01)


@pytest.mark.parametrize(("p", "m"), [(1, 1), (1, 5), (4, 2), (4, 4), (4, 9), (8, 20)])
def test_single_chunk_peak_equals_the_walk(p: int, m: int) -> None:
    # a chunk's backward frees what its forward kept (net 14 bytes), with transients inside both
    mem = ChunkMemory(fwd=[(5.0, 0.0), (3.0, -1.0), (7.0, 0.0)], bwd=[(0.0, -7.0), (4.0, -8.0), (2.0, -5.0)])
    for s, actions in enumerate(build_schedule("1f1b", p, m)):
        assert single_chunk_peak(mem, min(p - s, m)) == pytest.approx(closed_form_peak(actions, {0: mem}))


def test_enumerated_layouts_are_valid() -> None:
    run = load_config(SMALL)
    layouts = enumerate_layouts(run, 16, SearchSpace())
    assert len(layouts) > 100
    seen = set()
    for lay, train in layouts[::7]:
        data = {**SMALL, "layout": lay.model_dump(), "train": train.model_dump()}
        ok = load_config(data)  # raises if invalid
        assert ok.layout.world_size == 16
        seen.add((lay.tp, lay.pp, lay.cp))
    assert {t for t, _, _ in seen} >= {1, 2, 4, 8} and {c for _, _, c in seen} >= {1, 2}


def test_search_ranks_and_explains() -> None:
    r = search(SMALL, space=SearchSpace(cp=(1,)), top_k=3, workers=1)
    best = r.best
    assert best is not None and best.rank == 1 and best.fits
    sims = [c for c in r.candidates if c.status in ("best", "simulated") and c.fits]
    assert [c.step_time_s for c in sims] == sorted(c.step_time_s or 0 for c in sims)
    assert r.n_simulated == 3
    for c in r.candidates:
        if c.status == "memory":
            assert c.lost_to == "memory" and "GiB" in c.reason
        elif c.status != "best":
            assert c.reason and c.lost_to
    assert "estimated" in {c.status for c in r.candidates}
    frame = r.to_frame()
    assert len(frame) == len(r.candidates) and {"status", "reason", "layout.tp", "est_step_time_s"} <= set(frame)
    # the winner's likely measured range (simtrain.studies.uncertainty) is printed under the ranking
    assert best.row is not None and best.row["step_time_low_s"] < best.row["step_time_high_s"]
    assert f"best: {best.label()}" in render_search(r) and "likely measured" in render_search(r)


def test_search_refuses_bad_gpu_counts() -> None:
    with pytest.raises(ConfigError) as err:
        search(SMALL, gpus=12)
    assert err.value.problems[0].path == "--gpus"


def test_search_matches_exhaustive_simulation() -> None:
    """Llama 3 70B on 256 H100 (0.5M-token batch at 4K): the best layout search simulates (top 4 of its
    estimates) is the best that simulating every fitting layout of the space finds, within 1 %.
    The space is restricted to keep the exhaustive side fast: ZeRO-1, no recompute, TP 4/8, PP 2/4/8,
    micro-batch 1, every valid interleaving (the knobs whose trade-off the estimate has to get right)."""
    cfg = {"name": "exhaustive", "model": "llama3-70b", "hardware": {"node": "dgx-h100", "n_nodes": 32},
           "layout": {"tp": 8, "pp": 4, "dp": 8}, "train": {"seq_len": 4096, "global_batch_seqs": 128}}
    space = SearchSpace(tp=(4, 8), pp=(2, 4, 8), cp=(1,), micro_batch_size=(1,), zero_stage=(1,),
                        recompute=("none",))
    r = search(cfg, space=space, top_k=4, workers=2)
    assert r.best is not None
    fitting = [c for c in r.candidates if c.status in ("best", "simulated", "estimated")]
    assert len(fitting) > 12
    rows = run_points(base_data(cfg), [_point(c) for c in fitting], workers=2)
    exhaustive = min(row["step_time_s"] for row in rows if row["error"] is None and row["fits"])
    assert r.best.step_time_s == pytest.approx(exhaustive, rel=0.01)


def test_cli_search_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(SMALL))
    out = tmp_path / "cands.csv"
    assert main(["search", str(path), "--gpus", "16", "--top", "2", "--cp", "1", "--zero", "1", "--json",
                 "--workers", "1", "--show", "5", "--out", str(out)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n_gpus"] == 16 and got["best"]["status"] == "best" and len(got["candidates"]) == 5
    assert out.is_file()
    assert main(["search", str(path), "--tp", "x"]) == 2
    assert "--tp" in capsys.readouterr().err


def test_cli_search_moe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(MOE))
    assert main(["search", str(path), "--top", "1", "--tp", "1", "--pp", "2", "--cp", "1", "--mbs", "1", "--zero",
                 "1", "--recompute", "none", "--ep", "4,8", "--etp", "1", "--schedule", "auto,dualpipe", "--json",
                 "--workers", "1"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["best"]["layout"]["ep"] in (4, 8) and {c["layout"]["schedule"] for c in got["candidates"]} == {
        "auto", "dualpipe"}
    assert main(["search", str(path), "--schedule", "gpipe"]) == 2
    assert "--schedule" in capsys.readouterr().err


def test_search_offloads_the_fewest_layers_that_fit_where_offloading_beats_recompute() -> None:
    """Llama 3 70B on 64 GB200s with Megatron-FSDP at micro-batch 2 (Megatron-Bridge's recipe offloads
    40 layers): without a memory lever nothing at pp 1 fits; CPU offloading of the fewest layers that
    fit costs ~0.2 % (NVLink-C2C copies hide behind compute), full recompute ~17 %; offloading is
    tried only at pp 1 (Megatron-core's limit)."""
    path = Path(__file__).resolve().parent.parent / "examples" / "llama3_70b_gb200_offload.yaml"
    space = SearchSpace(tp=(1,), pp=(1, 2), cp=(1,), zero_stage=(3,), micro_batch_size=(2,),
                        recompute=("none", "full", "offload"))
    r = search(str(path), space=space, top_k=2, workers=1)
    best = r.best
    assert best is not None and best.layout["pp"] == 1 and best.layout["recompute"] == "none"
    n = best.layout["offload_activation_layers"]
    assert 30 <= n <= 45 and best.label().endswith(f"offload({n})")
    run = load_config(str(path))
    est = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio)
    lay = run.layout.model_copy(update={"zero_stage": 3, "fsdp": "none"})
    capacity = est.cluster.gpu.hbm_bytes
    assert max(est.stage_memory(lay.model_copy(update={"offload_activation_layers": n}), run.train, 2)) <= capacity
    assert max(est.stage_memory(lay.model_copy(update={"offload_activation_layers": n - 1}), run.train, 2)) > capacity
    full = [c for c in r.candidates if c.layout["pp"] == 1 and c.layout["recompute"] == "full"]
    assert full and all((c.est_step_time_s or 0) > 1.1 * (best.est_step_time_s or 0) for c in full)
    assert all(c.layout["pp"] == 1 for c in r.candidates if c.layout.get("offload_activation_layers"))


def test_every_time_component_has_a_cause() -> None:
    """Each component "why it lost" can name (the simulation's and the estimate's) maps to a cause: the
    CPU-offload waits had none, and search crashed explaining a loser whose excess was mostly offload
    (``KeyError: 'CPU offload'`` on examples/llama3_8b_h100_fsdp.yaml)."""
    zero = {k: 0.0 for k in ("compute_s", "bubble_s", "stage_imbalance_s", "exposed_tp_s", "exposed_dp_s",
                             "exposed_pp_s", "exposed_cp_s", "exposed_ep_s", "optimizer_s", "other_s")}
    best, mine = _sim_components({**zero, "offload_s": 0.0}), _sim_components({**zero, "offload_s": 0.5})
    est = load_config(SMALL)
    e = Estimator(est.model, cluster_of(est), est.sim.fragmentation_ratio).estimate(est.layout, est.train)
    assert set(best) | set(e.components()) <= set(CAUSE)
    cause, text = _why(mine, best, 10.5, 10.0, "simulated")
    assert cause == "CPU offload" and "CPU offload +0.5 s" in text and "+5.0 % vs best" in text


@pytest.mark.parametrize(("space", "path", "words"), [
    (SearchSpace(tp=(3,)), "--tp", ["tp 3 divides neither the 16 GPUs nor the 32 attention heads"]),
    (SearchSpace(tp=(3, 32)), "--tp", ["tp 3 divides neither", "tp 32 does not divide the 16 GPUs"]),
    (SearchSpace(micro_batch_size=(3,)), "--mbs", ["64 sequences"]),
    (SearchSpace(pp=(3,)), "--pp", ["pipeline"]),
    (SearchSpace(recompute=("selective",)), "--recompute", ["selective"]),
])
def test_an_empty_space_says_why(space: SearchSpace, path: str, words: list[str]) -> None:
    """A space that enumerates nothing is a ConfigError naming the knob and why, not "0 layouts
    enumerated" blamed on memory."""
    assert enumerate_layouts(load_config(SMALL), 16, space) == []
    with pytest.raises(ConfigError) as err:
        search(SMALL, space=space, workers=1)
    (prob,) = err.value.problems
    assert prob.path == path and all(w in prob.message for w in words), prob.message


def test_cli_search_tp3_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(Path(__file__).resolve().parent.parent / "examples" / "llama3_8b_h100_fsdp.yaml")
    assert main(["search", example, "--tp", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--tp" in err and "tp 3 divides neither the 8 GPUs nor" in err and "Traceback" not in err


def test_search_report_counts_labels_and_overflow() -> None:
    """Counts that add up to the layouts enumerated; every axis in the labels (tp x cp x pp x dp = GPUs);
    the layouts over capacity with how far over, in GiB and %, the closest first."""
    cfg = {**SMALL, "model": {"preset": "llama3-8b", "n_layers": 16}, "train": {"seq_len": 8192, "global_batch_seqs": 64}}
    r = search(cfg, space=SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch_size=(2,), zero_stage=(0,),
                                      recompute=("none",)), top_k=2, workers=1)
    c = r.counts()
    assert c["pruned_memory"] + c["dominated"] + c["infeasible"] + c["simulated"] + c["estimated_only"] \
        == c["enumerated"] == len(r.candidates)
    assert c["pruned_memory"] > 0 and c["simulated"] == c["fit"] + c["do_not_fit"] == r.n_simulated == 2
    for cand in r.candidates:
        lay = cand.layout
        words = cand.label().split()
        assert {f"tp{lay['tp']}", f"cp{lay['cp']}", f"pp{lay['pp']}", f"vpp{lay['vpp']}", f"dp{lay['dp']}"} <= set(words)
        assert lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"] == 16
    over = r.not_fitting()
    assert len(over) == c["pruned_memory"] + c["do_not_fit"]
    gaps = [o.over_capacity_bytes(r.capacity_bytes) or 0.0 for o in over]
    assert gaps == sorted(gaps) and gaps[0] > 0 and r.capacity_bytes == 80 * 1024**3
    text = render_search(r)
    assert f"{c['enumerated']} layouts enumerated: {c['pruned_memory']} pruned for memory" in text
    first = over[0]
    peak = first.peak_memory_bytes or first.est_peak_bytes or 0.0
    assert (f"{first.label():<52} peak {peak / 1024**3:.1f} GiB, +{gaps[0] / 1024**3:.1f} GiB "
            f"(+{100 * gaps[0] / r.capacity_bytes:.1f} %) over 80.0 GiB") in text
    assert "> 80.0 GiB HBM (+" in first.reason
    assert r.to_dict()["counts"] == c


def test_candidate_label_names_every_axis() -> None:
    cand = Candidate({"tp": 4, "cp": 2, "ep": 1, "etp": None, "pp": 2, "vpp": 8, "dp": 4, "zero_stage": 1,
                      "recompute": "none", "recompute_layers": None, "offload_activation_layers": 0,
                      "schedule": "auto"}, 1, 8)
    assert cand.label() == "tp4 cp2 pp2 vpp8 dp4 zero1 mbs1"
    moe = Candidate({**cand.layout, "ep": 8, "etp": 1, "schedule": "dualpipev", "recompute": "full",
                     "recompute_layers": 2}, 2, 8)
    assert moe.label() == "tp4 cp2 ep8 etp1 pp2 vpp8 dp4 zero1 mbs2 full(2) dualpipev"


def test_search_progress_on_request_only(capsys: pytest.CaptureFixture[str]) -> None:
    space = SearchSpace(tp=(1,), pp=(1,), cp=(1,), micro_batch_size=(1,), zero_stage=(1,), recompute=("none",))
    r = search(SMALL, space=space, top_k=1, workers=1)
    assert capsys.readouterr().err == ""
    search(SMALL, space=space, top_k=1, workers=1, progress=True)
    err = capsys.readouterr().err
    assert "estimating layouts" in err and f"{r.n_enumerated}/{r.n_enumerated}" in err
    assert "simulating best layouts" in err and "1/1" in err


def test_cli_search_fsdp_example_explains_an_offload_loser(capsys: pytest.CaptureFixture[str]) -> None:
    """The documented command on the shipped example, restricted to a few layouts: a loser whose excess
    is mostly CPU-offload waits is explained (this crashed with KeyError: 'CPU offload')."""
    example = str(Path(__file__).resolve().parent.parent / "examples" / "llama3_8b_h100_fsdp.yaml")
    assert main(["search", example, "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1,3", "--mbs", "1,2",
                 "--top", "4", "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "vs best: CPU offload +" in out and "layouts do not fit in memory; the closest:" in out
