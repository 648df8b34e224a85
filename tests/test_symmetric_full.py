"""Symmetric mode (one rank per stage, weighted flows) against full mode (every rank simulated)."""

from __future__ import annotations

import pytest

from simtrain.studies.simulate import simulate

TINY = dict(name="tiny", n_layers=8, hidden=512, n_heads=8, n_kv_heads=4, ffn_hidden=1024,
            activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False,
            linear_bias=False)

CASES = {
    "dp8": dict(n_nodes=1, layout=dict(dp=8), seqs=16),
    "tp2-pp2-dp2": dict(n_nodes=1, layout=dict(tp=2, pp=2, dp=2, sequence_parallel=True), seqs=8),
    "tp8": dict(n_nodes=1, layout=dict(tp=8), seqs=2),
    "pp4-dp2-zero1": dict(n_nodes=1, layout=dict(pp=4, dp=2, zero_stage=1), seqs=16),
    "dp4-tp2-zero2": dict(n_nodes=1, layout=dict(dp=4, tp=2, zero_stage=2), seqs=8),
    "pp2-dp4-zero3": dict(n_nodes=1, layout=dict(pp=2, dp=4, zero_stage=3), seqs=8),
    "vpp2": dict(n_nodes=1, layout=dict(pp=2, vpp=2, dp=2, tp=2), seqs=8),
    "2n-dp16": dict(n_nodes=2, layout=dict(dp=16), seqs=32),
    "2n-4nic-dp8-tp2": dict(n_nodes=2, nics=4, layout=dict(dp=8, tp=2), seqs=16),
    "2n-4nic-pp2-dp8": dict(n_nodes=2, nics=4, layout=dict(pp=2, dp=8, zero_stage=1), seqs=16),
    "2n-fsdp-hybrid": dict(n_nodes=2, layout=dict(dp=16, fsdp="hybrid", fsdp_shard_size=8), seqs=16),
    "2n-4nic-fsdp-full": dict(n_nodes=2, nics=4, layout=dict(pp=2, dp=8, fsdp="full"), seqs=8),
    "4n-tp8-pp2-dp2": dict(n_nodes=4, layout=dict(tp=8, pp=2, dp=2, zero_stage=1), seqs=8),
    "8n-tp4-pp2-dp8": dict(n_nodes=8, layout=dict(tp=4, pp=2, dp=8, zero_stage=1), seqs=16),
    "8n-dp-order": dict(n_nodes=8, layout=dict(tp=2, pp=4, dp=8, order=["dp", "tp", "cp", "ep", "pp"]),
                        seqs=32),
    "2n-cp2-ring": dict(n_nodes=2, layout=dict(tp=4, cp=2, dp=2, pp=1, zero_stage=1), seqs=8),
    "2n-cp4-allgather-pp2": dict(n_nodes=2, layout=dict(tp=2, cp=4, pp=2, cp_comm="all_gather"), seqs=8),
    "1n-cp2-a2a": dict(n_nodes=1, layout=dict(tp=2, cp=2, dp=2, cp_comm="a2a", fsdp="full"), seqs=8),
    # stage stride of 4 GPUs: the stage 1 -> 2 send crosses nodes from local index 4+ to 0+, so rails differ
    "2n-4nic-pp4-dp4-cross-rail": dict(n_nodes=2, nics=4, layout=dict(pp=4, dp=4, zero_stage=1), seqs=16),
    "1n-tp2-dp4-cpu-offload": dict(n_nodes=1, layout=dict(tp=2, dp=4, zero_stage=1, offload_activation_layers=5),
                                   seqs=8),
}


def _cfg(case: dict) -> dict:
    hw = dict(n_nodes=case["n_nodes"])
    if "nics" in case:
        hw["nics_per_node"] = case["nics"]
    return dict(model=TINY, hardware=hw, layout=case["layout"],
                train=dict(seq_len=512, global_batch_seqs=case["seqs"]))


@pytest.mark.parametrize("name", list(CASES))
def test_symmetric_matches_full(name: str) -> None:
    cfg = _cfg(CASES[name])
    sym = simulate(cfg, mode="symmetric")
    full = simulate(cfg, mode="full")
    assert sym.mode == "symmetric" and full.mode == "full"
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.01)
    assert len(sym.memory) == len(full.memory)
    for a, b in zip(sym.memory, full.memory, strict=True):
        assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=1e-9)
    world = sym.n_gpus
    pp = cfg["layout"].get("pp", 1)
    assert full.ops_executed == sym.ops_executed * world // pp


def test_irregular_placement_runs_by_role() -> None:
    """dp=12 on 8-GPU nodes: one node holds 8 ranks of the group, the next 4, so ranks are not
    interchangeable; symmetric mode simulates them by role (``simtrain.plan.roles``: here every DP group,
    one per stage, is placed alike, so one role) with the DP group's whole ring, and agrees with full mode."""
    cfg = _cfg(dict(n_nodes=3, nics=4, layout=dict(pp=2, dp=12, zero_stage=1), seqs=24))
    sym = simulate(cfg, mode="symmetric")
    full = simulate(cfg, mode="full")
    assert sym.mode == "symmetric" and sym.notes and "by role" in sym.notes[0] and "(1 role," in sym.notes[0]
    assert sorted(sym.stage_of) == [0, 12]
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.005)
    for a, b in zip(sym.memory, full.memory, strict=True):
        assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=1e-9)
    assert simulate(_cfg(CASES["8n-tp4-pp2-dp8"])).notes == []
