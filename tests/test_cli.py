"""Command line: exit codes, JSON output, traces and error messages with dotted paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simtrain.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "llama3_70b_h100.yaml")
# the example at a 32-sequence batch: same model and layout, far fewer micro-batches (fast)
SMALL = ["--set", "train.global_batch_tokens=262144"]

TINY = dict(name="tiny", n_layers=4, hidden=256, n_heads=4, ffn_hidden=1024, activation="gelu",
            norm="layernorm", position="rope", vocab=1024, tied_embeddings=False, linear_bias=False)


def _write(tmp_path: Path, cfg: dict, name: str = "run.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def _tiny_cfg(**layout) -> dict:
    return dict(model=TINY, hardware=dict(n_nodes=1), layout=dict(dict(dp=8), **layout),
                train=dict(seq_len=512, global_batch_seqs=16))


def test_simulate_example_json(capsys) -> None:
    assert main(["simulate", EXAMPLE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                "hardware_tflops_per_gpu", "mfu", "hfu", "n_gpus", "global_batch_tokens", "breakdown_s",
                "memory", "fits"):
        assert key in out, key
    assert set(out["breakdown_s"]) >= {"compute", "exposed_comm", "bubble", "optimizer", "other"}
    assert out["n_gpus"] == 64
    assert out["global_batch_tokens"] == 4194304
    assert out["step_time_s"] > 0 and 0 < out["mfu"] <= 1 and 0 < out["hfu"] <= 1
    assert out["tokens_per_s"] == pytest.approx(out["global_batch_tokens"] / out["step_time_s"])
    assert out["tokens_per_s_per_gpu"] == pytest.approx(out["tokens_per_s"] / 64)
    assert len(out["memory"]) == 2
    for m in out["memory"]:
        assert {"peak_bytes", "components", "capacity_bytes"} <= set(m)
        assert "timeline" not in m
        assert m["peak_bytes"] > 0
    assert out["fits"] == all(m["peak_bytes"] <= m["capacity_bytes"] for m in out["memory"])


def test_simulate_summary_text(capsys) -> None:
    assert main(["simulate", EXAMPLE, *SMALL]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "MFU" in out and "stage   0" in out


def test_simulate_trace_with_overrides(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "sub" / "trace.json"
    rc = main(["simulate", EXAMPLE, *SMALL, "--set", "layout.tp=4", "--set", "layout.dp=8",
               "--set", "train.micro_batch_size=2", "--trace", str(trace), "--json", "--timeline"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["tp"] == 4 and out["layout"]["dp"] == 8
    assert "timeline" in out["memory"][0]
    data = json.loads(trace.read_text())
    events = data["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
    assert {e["pid"] for e in spans} == {0, 32}  # symmetric: one representative rank per stage
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(out["step_time_s"] * 1e6, rel=1e-9)


def test_models_and_hardware_commands(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "llama3-70b" in out and "gpt3-175b" in out
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "dgx-h100" in out


def test_full_mode_flag(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, _tiny_cfg())
    assert main(["simulate", path, "--mode", "full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "full"


BAD_OVERRIDES = [
    (["layout.tp=3"], "layout.tp"),  # tp does not divide heads
    (["layout.dp=2"], "layout"),  # world size mismatch
    (["layout.pp=128", "layout.dp=1", "layout.tp=1", "hardware.n_nodes=16"], "layout.pp"),  # pp > layers
    (["layout.vpp=42"], "layout.vpp"),  # 84 chunks for 80 layers
    # a batch in sequences is the user's exact count (a token batch is rounded: simtrain.spec.load.round_token_batch)
    (["train.global_batch_tokens=null", "train.global_batch_seqs=100", "train.micro_batch_size=3"],
     "train.global_batch_seqs"),
    (["model=no-such-model"], "model"),
    (["hardware.gpu=no-such-gpu"], "hardware.gpu"),
    (["hardware.node=no-such-node"], "hardware.node"),
    (["layout.no_such_key=1"], "layout.no_such_key"),
    (["layout.tp=0"], "layout.tp"),
    (["train.seq_len=-8"], "train.seq_len"),
    (["hardware.n_nodes=0"], "hardware.n_nodes"),
    (["train.micro_batch_size=0"], "train.micro_batch_size"),
    (["layout.zero_stage=5"], "layout.zero_stage"),
    (["layout.schedule=zigzag"], "layout.schedule"),
    (["layout.fsdp=full"], "layout.fsdp"),  # conflicts with zero_stage=1
]


@pytest.mark.parametrize("overrides,path", BAD_OVERRIDES, ids=[p for _, p in BAD_OVERRIDES])
def test_bad_config_exits_2_with_dotted_path(overrides: list[str], path: str, capsys) -> None:
    args = ["simulate", EXAMPLE]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}:" in captured.err
    assert "Traceback" not in captured.err


def test_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "config:" in err and "not found" in err


def test_malformed_yaml(tmp_path: Path, capsys) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed\nlayout: {tp: 2\n")
    assert main(["simulate", str(p)]) == 2
    err = capsys.readouterr().err
    assert "config:" in err and "YAML" in err


def test_non_mapping_yaml(tmp_path: Path, capsys) -> None:
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    assert main(["simulate", str(p)]) == 2
    assert "config:" in capsys.readouterr().err


def test_every_problem_is_reported(tmp_path: Path, capsys) -> None:
    cfg = _tiny_cfg(tp=3, pp=9)
    assert main(["simulate", _write(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "layout.tp:" in err and "layout.pp:" in err


def test_bad_set_syntax(capsys) -> None:
    assert main(["simulate", EXAMPLE, "--set", "layout.tp"]) == 2
    assert "--set:" in capsys.readouterr().err


def test_expert_parallelism_on_a_dense_model_is_a_config_error(capsys) -> None:
    assert main(["simulate", EXAMPLE, "--set", "layout.ep=2"]) == 2
    err = capsys.readouterr().err
    assert "layout.ep" in err and "MoE" in err and "Traceback" not in err


def test_unknown_calibrated_profile_is_a_config_error(capsys) -> None:
    assert main(["simulate", EXAMPLE, "--set", "hardware.profile=no-such-profile"]) == 2
    err = capsys.readouterr().err
    assert "hardware.profile" in err and "simtrain calibrate" in err and "Traceback" not in err


def test_tiny_model_on_half_a_node_and_a_gpus_per_node_beyond_the_node(capsys, tmp_path: Path) -> None:
    cfg = _tiny_cfg(dp=4)
    cfg["hardware"] = dict(node="dgx-h100", gpus_per_node=4)
    assert main(["simulate", _write(tmp_path, cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_gpus"] == 4
    assert main(["simulate", _write(tmp_path, cfg), "--set", "hardware.gpus_per_node=16"]) == 2
    assert "hardware.gpus_per_node: 16" in capsys.readouterr().err
