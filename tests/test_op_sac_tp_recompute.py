"""torchtitan's op-level SAC under TP: the replay before a layer's backward re-runs the TP all-gathers
its save list leaves out (it saves reduce-scatter outputs, not all-gather outputs)."""

from __future__ import annotations

import pytest

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.profile import compute_calibration, run_cluster
from simtrain.lower.lowering import Lowered
from simtrain.lower.ops import ComputeOp
from simtrain.plan.load import load_config
from simtrain.spec.stacks import get_stack
from simtrain.studies.estimate import Estimator
from simtrain.studies.simulate import cluster_of, simulate

LLAMA_TINY = dict(name="ltiny", n_layers=4, hidden=1024, n_heads=8, n_kv_heads=2, ffn_hidden=2816,
                  activation="swiglu", norm="rmsnorm", position="rope", vocab=8192, tied_embeddings=False,
                  linear_bias=False)
TP, MICRO = 4, 2


def _cfg(recompute: str, sp: bool = True, overlap: bool = False) -> dict:
    return dict(model=LLAMA_TINY, hardware=dict(n_nodes=1),
                layout=dict(tp=TP, dp=8 // TP, recompute=recompute, sequence_parallel=sp, tp_comm_overlap=overlap),
                train=dict(seq_len=2048, global_batch_seqs=MICRO * 8 // TP, micro_batch_size=1,
                           stack="torchtitan-compile"))


def _lowered(cfg: dict) -> Lowered:
    run = load_config(cfg)
    gpu = run_cluster(run.hardware, run.layout.world_size).gpu
    cost = ComputeCostModel(gpu, run.train.precision, calibration=compute_calibration(gpu),
                            stack=get_stack(run.train.stack), fp8_recipe=run.train.fp8_recipe)
    return lower(run, cost)


def _tp_colls(low: Lowered, coll: str) -> list:
    return [op for op in low.programs[0].ops if op.name == f"tp.{coll}"]


def test_op_sac_replays_two_all_gathers_per_dense_layer_with_sp() -> None:
    none, sac = _lowered(_cfg("none")), _lowered(_cfg("op_sac"))
    layers = LLAMA_TINY["n_layers"]
    extra = len(_tp_colls(sac, "all_gather")) - len(_tp_colls(none, "all_gather"))
    assert extra == 2 * layers * MICRO
    # the replayed k_proj waits for a replayed gather (vanilla TP: the gather precedes its consumer)
    ops = sac.programs[0].ops
    # (torchtitan's DTensor layout copy of the gathered tensor runs first in the same compute op)
    replays = [op for op in ops if op.category == "recompute" and isinstance(op, ComputeOp) and op.kernels
               and any(k.name.startswith("k_proj") for k in op.kernels)]
    assert len(replays) == layers * MICRO
    assert all(any(ops[d].name == "tp.all_gather" for d in op.deps) for op in replays)
    # reduce-scatter outputs are saved: none is re-run
    assert len(_tp_colls(sac, "reduce_scatter")) == len(_tp_colls(none, "reduce_scatter"))
    tokens = 2048  # one sequence per micro-batch; the gathered tensor is the full b*s*h bf16 activation
    assert _tp_colls(sac, "all_gather")[0].comm_bytes == pytest.approx(2.0 * tokens * 1024)


def test_op_sac_without_sp_replays_the_attention_all_reduce() -> None:
    none, sac = _lowered(_cfg("none", sp=False)), _lowered(_cfg("op_sac", sp=False))
    extra = len(_tp_colls(sac, "all_reduce")) - len(_tp_colls(none, "all_reduce"))
    assert extra == LLAMA_TINY["n_layers"] * MICRO
    assert not _tp_colls(sac, "all_gather")


def test_replayed_all_gathers_cost_step_time_and_the_estimate_follows() -> None:
    """Vanilla TP: the re-run gathers are exposed, so op-SAC costs more than its kernels alone; the
    search estimate prices the same segments (within its usual few per cent of the engine)."""
    for overlap in (False, True):
        cfg = _cfg("op_sac", overlap=overlap)
        run = load_config(cfg)
        est = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio).estimate(run.layout, run.train)
        assert est.step_time_s == pytest.approx(simulate(run).step_time_s, rel=0.08)
    sac, none = simulate(_cfg("op_sac")), simulate(_cfg("none"))
    assert sac.breakdown_s["exposed_comm"]["tp"] > 1.15 * none.breakdown_s["exposed_comm"]["tp"]
