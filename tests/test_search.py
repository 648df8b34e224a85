"""Layout search (simtrain.search) and its closed-form estimate (simtrain.estimate)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simtrain.cli import main
from simtrain.config import load_config
from simtrain.errors import ConfigError
from simtrain.estimate import Estimator, single_chunk_peak
from simtrain.memory import ChunkMemory, closed_form_peak
from simtrain.schedules import build_schedule
from simtrain.search import SearchSpace, _point, enumerate_layouts, search
from simtrain.simulate import cluster_of, simulate
from simtrain.sweep import base_data, run_points

SMALL: dict[str, Any] = {
    "name": "search-test", "model": {"preset": "llama3-8b", "n_layers": 8},
    "hardware": {"node": "dgx-h100", "n_nodes": 2}, "layout": {"tp": 1, "dp": 16},
    "train": {"seq_len": 2048, "global_batch_seqs": 64},
}


@pytest.mark.parametrize("overrides", [
    [],
    ["layout.tp=2", "layout.dp=4", "layout.pp=2", "layout.sequence_parallel=true", "layout.zero_stage=1"],
    ["layout.tp=2", "layout.dp=2", "layout.pp=4", "layout.vpp=2", "layout.zero_stage=2", "layout.recompute=full",
     "layout.recompute_layers=1"],
    ["layout.tp=4", "layout.dp=2", "layout.cp=2", "layout.zero_stage=3", "train.micro_batch_size=2"],
    ["layout.pp=8", "layout.dp=2", "train.attention_kernel=unfused", "layout.recompute=selective"],
])
def test_estimate_memory_equals_the_engine(overrides: list[str]) -> None:
    """Per-stage peak memory of the closed form equals the simulated ledger's, stage by stage."""
    run = load_config(SMALL, overrides)
    est = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio)
    e = est.estimate(run.layout, run.train)
    r = simulate(run)
    assert list(e.stage_peak_bytes) == pytest.approx([m.peak_bytes for m in r.memory], rel=1e-9)
    assert e.step_time_s == pytest.approx(r.step_time_s, rel=0.25)


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


def test_search_refuses_bad_gpu_counts_and_moe() -> None:
    with pytest.raises(ConfigError) as err:
        search(SMALL, gpus=12)
    assert err.value.problems[0].path == "--gpus"
    with pytest.raises(ConfigError) as err:
        search({**SMALL, "model": "mixtral-8x7b"}, gpus=8)
    assert err.value.problems[0].path == "model"


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
