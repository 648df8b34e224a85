"""Bugs the fuzz campaign found (issue 31, benchmarks/fuzz_known.py ``FOUND_BY_FUZZ``), each replayed from its
case: a clean refusal (exit 2, the field's path) instead of a traceback, or an answer that holds the invariants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simtrain.cli import main
from simtrain.config import RunConfig
from simtrain.errors import ConfigError
from simtrain.validate import check_run


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
    from simtrain.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_case_331()))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert any(p.path == "layout.offload_activation_layers" for p in info.value.problems)
