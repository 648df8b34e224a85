"""Bugs the fuzz campaign found (issue 31, benchmarks/fuzz_known.py ``FOUND_BY_FUZZ``), each replayed from its
case: a clean refusal (exit 2, the field's path) instead of a traceback, or an answer that holds the invariants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simtrain.cli.main import main
from simtrain.lower.flops import attention_keys_per_query, layer_forward_flops_per_token, model_flops_per_step
from simtrain.lower.layer_plan import first_layers, split_layers
from simtrain.plan.schedules import schedule_route
from simtrain.plan.validate import check_run
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError
from simtrain.studies.simulate import simulate


def _case_331(**layout: Any) -> dict[str, Any]:
    """Fuzz case 331 of seed 1: Mixtral 8x7B cut to 2 layers, DualPipeV at pp=1, one layer offloaded."""
    lay = {"tp": 1, "cp": 1, "pp": 1, "dp": 8, "ep": 2, "schedule": "dualpipev", "fsdp": "hybrid",
           "fsdp_shard_size": 8, "recompute": "none", "offload_activation_layers": 1, **layout}
    return {"name": "fuzz", "model": {"preset": "mixtral-8x7b", "n_layers": 2},
            "hardware": {"node": "dgx-b300", "n_nodes": 1}, "layout": lay,
            "train": {"seq_len": 256, "micro_batch_size": 4, "precision": "fp16", "stack": "torchtitan-compile",
                      "global_batch_seqs": 128, "moe_routing": "skewed", "moe_hot_expert_load": 4.0}}


@pytest.mark.parametrize("n_layers", [2, 4, 8])
def test_dualpipev_at_pp1_with_cpu_offload_is_refused_at_its_field(n_layers: int) -> None:
    cfg = _case_331()
    cfg["model"]["n_layers"] = n_layers
    problems = check_run(RunConfig.model_validate(cfg))
    offload = [p for p in problems if p.path == "layout.offload_activation_layers"]
    assert len(offload) == 1 and "one model chunk per rank" in offload[0].message
    assert "'dualpipev'" in offload[0].message


def test_dualpipev_offload_cli_exit_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_case_331()))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "layout.offload_activation_layers" in err and "Traceback" not in err and "ValueError" not in err


def test_offload_with_one_chunk_at_pp1_is_still_accepted() -> None:
    """The same case under 1F1B (one chunk) is what Megatron-core allows: no offload problem."""
    problems = check_run(RunConfig.model_validate(_case_331(schedule="1f1b")))
    assert not [p for p in problems if p.path == "layout.offload_activation_layers"]


def test_config_error_is_raised_by_load(tmp_path: Path) -> None:
    from simtrain.plan.load import load_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_case_331()))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert any(p.path == "layout.offload_activation_layers" for p in info.value.problems)


# -- DualPipe(V) with MoE: hardware FLOPs = the model's closed form (fuzz cases 351, 591) ----------------------
def _moe_run(preset: str, n_layers: int, schedule: str, recompute: str) -> dict[str, Any]:
    return {"name": "t", "model": {"preset": preset, "n_layers": n_layers},
            "hardware": {"node": "dgx-h100", "n_nodes": 1},
            "layout": {"tp": 1, "pp": 2, "dp": 4, "ep": 4, "schedule": schedule, "recompute": recompute},
            "train": {"seq_len": 1024, "micro_batch_size": 1, "global_batch_seqs": 32}}


def _hardware_flops_closed_form(run: RunConfig, tokens: int) -> float:
    """Hardware FLOPs of a step: the model's FLOPs (flops.model_flops_per_step), plus FlashAttention's
    backward recomputing QK^T (5 attention GEMMs against the forward's 2: 2.5 x the forward, where the
    model counts 2 x; Dao 2023 FlashAttention-2 sec. 3.1.2), plus with full recompute one more forward of
    every transformer layer (not the embedding, head or MTP modules)."""
    m, s = run.model, run.train.seq_len
    attn = sum(2 * attention_keys_per_query(m, i, s) * (m.d_head + m.v_head_dim) * m.n_heads
               for i in range(m.n_layers + m.mtp_depth))
    extra = 0.5 * attn
    if run.layout.recompute == "full":
        extra += sum(layer_forward_flops_per_token(m, i, s) for i in range(m.n_layers))
    return model_flops_per_step(m, s, tokens) + tokens * extra


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev", "1f1b"])
@pytest.mark.parametrize(("preset", "n_layers"), [("deepseek-v3", 8), ("mixtral-8x7b", 4), ("qwen3-30b-a3b", 4)])
def test_dualpipe_moe_hardware_flops_equal_the_closed_form(preset: str, n_layers: int, schedule: str,
                                                           recompute: str) -> None:
    """DeepSeek-V3 cut to 8 layers keeps its 3 dense layers first: before the fix every DualPipe stage's
    chunk 0 ran layers 0.. (dense) instead of its own, so the hardware FLOPs fell below the model's."""
    run = RunConfig.model_validate(_moe_run(preset, n_layers, schedule, recompute))
    r = simulate(run)
    hw = r.hardware_tflops_per_gpu * 1e12 * r.step_time_s * r.n_gpus
    assert hw == pytest.approx(_hardware_flops_closed_form(run, r.global_batch_tokens), rel=1e-9)
    assert r.hfu >= r.mfu


def test_first_layers_of_dualpipe_chunks() -> None:
    """DualPipe holds the model once per direction: stage s chunk 0 and stage p-1-s chunk 1 are one position."""
    route = schedule_route("dualpipe", 4, 16)
    layers = split_layers(10, 4, 1, route)
    assert layers == [[2, 2], [3, 3], [3, 3], [2, 2]]
    assert first_layers(layers, route) == [[0, 8], [2, 5], [5, 2], [8, 0]]
    v = schedule_route("dualpipev", 4, 16)
    assert first_layers(split_layers(10, 4, 1, v), v) == [[0, 9], [1, 8], [2, 7], [3, 5]]


def test_fuzz_case_351_simulates_with_hfu_above_mfu() -> None:
    """The fuzz case itself (first_k_dense 1, 4 layers, DualPipe pp 2, op-level SAC): exit 3 before."""
    cfg = {"name": "fuzz", "model": {"name": "fuzz", "n_layers": 4, "hidden": 2048, "n_heads": 16, "n_kv_heads": 1,
                                     "ffn_hidden": 2048, "activation": "swiglu", "norm": "rmsnorm",
                                     "position": "learned", "max_position": 8192, "vocab": 4096,
                                     "tied_embeddings": True, "linear_bias": False,
                                     "moe": {"n_experts": 8, "top_k": 8, "ffn_hidden": 1024, "n_shared_experts": 0,
                                             "first_k_dense": 1}},
           "hardware": {"node": "dgx-b300", "n_nodes": 1, "gpus_per_node": 2, "nodes_per_leaf": 1},
           "layout": {"tp": 1, "cp": 1, "pp": 2, "dp": 1, "ep": 1, "schedule": "dualpipe", "zero_stage": 0,
                      "recompute": "op_sac", "ep_comm_overlap": True, "ep_dispatcher": "alltoall"},
           "train": {"seq_len": 512, "micro_batch_size": 2, "precision": "bf16", "stack": "megatron-legacy",
                     "global_batch_seqs": 16}}
    r = simulate(cfg)
    assert 0 < r.mfu <= r.hfu <= 1
    same_1f1b = simulate({**cfg, "layout": {**cfg["layout"], "schedule": "1f1b"}})
    assert r.hfu / r.mfu == pytest.approx(same_1f1b.hfu / same_1f1b.mfu, rel=1e-9)
