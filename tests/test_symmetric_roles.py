"""Symmetric mode by role (issue 31's speed cliff): groups that do not tile the nodes / NVLink domains.

16-GPU TP x CP blocks on 72-GPU NVL72 domains (72 / 16 = 4.5) leave some CP groups spanning two
domains; symmetric mode used to fall back to simulating every rank (over 300 s at 2,304 GPUs). It
now simulates one representative per stage and role (``simtrain.plan.roles``) and must agree with full
mode, which simulates every rank.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from test_symmetric_full import TINY

from simtrain.hardware.topology import Topology
from simtrain.plan.layout import RankGrid
from simtrain.plan.load import load_config
from simtrain.plan.roles import placement, roles, tiles
from simtrain.spec.errors import InfeasibleLayout
from simtrain.spec.model import preset
from simtrain.studies.simulate import _group_axes, cluster_of, simulate

simulate_module = importlib.import_module("simtrain.studies.simulate")  # the module (simtrain.simulate is also the function)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama3_8b_h100_fsdp.yaml"


def _nvl72(n_domains: int, n_layers: int | None = None, pp: int = 1) -> tuple[dict, list[str]]:
    """The issue's reproducer (tp 8 x cp 2 on GB200 NVL72, 8 micro-batches of 4 x 4,096 tokens per
    rank), on ``n_domains`` domains and, when given, ``n_layers`` layers."""
    import yaml

    with open(EXAMPLE) as f:
        cfg = yaml.safe_load(f)
    if n_layers is not None:
        model = preset("llama3-8b").model_dump(mode="json")
        model["n_layers"] = n_layers
        cfg["model"] = model
    dp = n_domains * 72 // (16 * pp)
    overrides = ["hardware.node=gb200-nvl72", f"hardware.n_nodes={n_domains}",
                 f"layout={{tp: 8, cp: 2, pp: {pp}, dp: {dp}, sequence_parallel: true, fsdp: full, "
                 "recompute: selective}", "train.seq_len=4096", "train.micro_batch_size=4",
                 f"train.global_batch_seqs={dp * 4 * 8}", "train.global_batch_tokens=null"]
    return cfg, overrides


def _small(n_nodes: int, gpus_per_node: int, layout: dict, seqs: int) -> dict:
    return dict(model=TINY, hardware=dict(n_nodes=n_nodes, gpus_per_node=gpus_per_node), layout=layout,
                train=dict(seq_len=512, global_batch_seqs=seqs))


def test_placement_and_tiling() -> None:
    """Placement relabels nodes by first appearance; a group tiles when each node holds as many members."""
    run = load_config(*_nvl72(2))
    topo = Topology(cluster_of(run))
    assert placement(topo, (64, 72)) == (0, 1) and placement(topo, (72, 80)) == (0, 0)
    assert tiles(topo, (64, 72)) and tiles(topo, tuple(range(8)))
    assert not tiles(topo, (0, 16, 32, 48, 64, 80, 96, 112, 128))  # 5 on domain 0, 4 on domain 1


def test_reproducer_roles() -> None:
    """2,304 GPUs (32 NVL72 domains), tp 8 x cp 2: a CP group lies in one domain or spans two, and a DP
    group holds 5 then 4 or 4 then 5 members per domain (by its CP coordinate): 4 roles, whose stage-0
    representatives are the lowest ranks of each."""
    run = load_config(*_nvl72(32))
    grid, topo = RankGrid(run.layout), Topology(cluster_of(run))
    reps = roles(grid, topo, _group_axes(run))
    assert [r[0] for r in reps] == [0, 8, 64, 72]
    assert placement(topo, grid.group("cp", 64)) == (0, 1) and placement(topo, grid.group("cp", 0)) == (0, 0)


def test_reproducer_simulates_one_rank_per_role() -> None:
    """The full-size reproducer of issue 31 runs in symmetric mode with 4 simulated ranks (not 2,304),
    and says so in its notes."""
    res = simulate(*_nvl72(32))
    assert res.mode == "symmetric" and res.n_gpus == 2304
    assert sorted(res.stage_of) == [0, 8, 64, 72]
    assert any("4 roles" in n for n in res.notes) and any("critical role" in n for n in res.notes)


@pytest.mark.parametrize("n_domains,n_layers,pp", [(4, 2, 1), (8, 2, 1), (4, 2, 2)])
def test_roles_match_full_mode_nvl72(n_domains: int, n_layers: int, pp: int) -> None:
    """Reduced reproducers (4-8 NVL72 domains, few layers): symmetric by role = full mode within 0.5 %,
    with the same per-stage memory peaks."""
    cfg, overrides = _nvl72(n_domains, n_layers, pp)
    sym = simulate(cfg, overrides, mode="symmetric")
    full = simulate(cfg, overrides, mode="full")
    assert sym.mode == "symmetric" and full.mode == "full"
    assert len(sym.stage_of) == 4 * pp < full.n_gpus == len(full.stage_of)
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.005)
    for a, b in zip(sym.memory, full.memory, strict=True):
        assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=1e-9)


SMALL = {
    # 4-GPU TP x CP blocks on 6-GPU nodes: every other block's CP groups span two nodes
    "6g-tp2-cp2": (4, 6, dict(tp=2, cp=2, dp=6, sequence_parallel=True), 12),
    "6g-tp2-cp2-fsdp": (4, 6, dict(tp=2, cp=2, dp=6, fsdp="full"), 12),
    "6g-tp2-cp2-pp2": (4, 6, dict(tp=2, cp=2, dp=3, pp=2), 12),
    # TP outermost: 15-rank DP groups over 6-GPU nodes hold 6, 6 and 3 members per node
    "6g-tp-outermost": (5, 6, dict(tp=2, dp=15, order=["dp", "cp", "ep", "pp", "tp"]), 30),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_roles_match_full_mode_small(name: str) -> None:
    """Small clusters whose groups do not tile the nodes, the symmetry-breaking order among them:
    symmetric mode by role agrees with full mode within 0.5 %."""
    cfg = _small(*SMALL[name])
    sym = simulate(cfg, mode="symmetric")
    full = simulate(cfg, mode="full")
    assert sym.mode == "symmetric" and any("roles" in n for n in sym.notes)
    assert len(sym.stage_of) < full.n_gpus
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.005)


def test_too_many_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    """More roles than simtrain.plan.roles.MAX_ROLES: a small world falls back to full mode (with a note);
    a large one is refused naming layout.order and sim.mode, never run for minutes."""
    cfg = _small(*SMALL["6g-tp2-cp2"])
    monkeypatch.setattr(simulate_module, "MAX_ROLES", 1)
    monkeypatch.setattr("simtrain.plan.roles.MAX_ROLES", 1)
    res = simulate(cfg)
    assert res.mode == "full" and "more than 1 roles" in res.notes[0]
    monkeypatch.setattr(simulate_module, "FULL_MODE_WORLD", 8)
    with pytest.raises(InfeasibleLayout, match="layout.order.*sim.mode=full"):
        simulate(cfg)
