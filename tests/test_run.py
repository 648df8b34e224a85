"""Batch-size schedules (simtrain.spec.batch) and whole runs (simtrain.studies.run): arithmetic, caching, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from simtrain.cli.main import main
from simtrain.engine.results import StepResult
from simtrain.plan.load import load_config
from simtrain.plan.phases import resolve_phases
from simtrain.spec.batch import parse_count
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError
from simtrain.studies.run import phase_config, simulate_run

ROOT = Path(__file__).resolve().parent.parent
BASE: dict[str, Any] = {
    "name": "tiny-run", "model": "gpt-1.7b", "hardware": {"node": "dgx-h100", "n_nodes": 1},
    "layout": {"tp": 1, "dp": 8}, "train": {"seq_len": 1024, "global_batch_seqs": 64},
}


def cfg(run: dict[str, Any], **train: Any) -> dict[str, Any]:
    return {**BASE, "train": {**BASE["train"], **train}, "run": run}


def fake_step(run: RunConfig) -> StepResult:
    """A StepResult whose step time is 1 ms per sequence (no engine)."""
    seqs = run.train.global_batch_seqs_resolved
    return StepResult(name=run.name, mode="symmetric", step_time_s=seqs * 1e-3, tokens_per_s=1.0,
                      tokens_per_s_per_gpu=1.0, model_tflops_per_gpu=1.0, hardware_tflops_per_gpu=1.0, mfu=0.5,
                      hfu=0.5, n_gpus=8, global_batch_tokens=seqs * run.train.seq_len, microbatches=seqs // 8,
                      breakdown_s={}, memory=[], fits=True, layout={}, ops_executed=0)


def test_parse_count_suffixes() -> None:
    assert parse_count("1.4T") == 1.4e12
    assert parse_count("469B") == 469e9
    assert parse_count("4Mi") == 4 * 2**20
    assert parse_count("1e12") == 1e12
    assert parse_count("lots") == "lots"


@pytest.mark.parametrize(("given", "seq_len", "tokens"), [
    ("4Mi", 1024, 4 * 2**20), ("16Mi", 1024, 16 * 2**20), ("512Ki", 1024, 2**19), ("1Gi", 1024, 2**30),
    ("4M", 500, 4_000_000), ("1.5M", 500, 1_500_000), ("512K", 500, 512_000), ("1G", 500, 10**9),
    ("4mi", 1024, 4 * 2**20), (4194304, 1024, 4194304),
])
def test_global_batch_tokens_accepts_human_counts(tmp_path: Path, given: Any, seq_len: int, tokens: int) -> None:
    """train.global_batch_tokens takes "4M" (10^6) and "4Mi" (2^20), K/Ki and G/Gi too, in a YAML file and
    through --set, as a whole number of tokens."""
    train = {"seq_len": seq_len, "global_batch_tokens": given}
    path = tmp_path / "c.yaml"
    path.write_text(f"name: t\nmodel: gpt-1.7b\nlayout: {{dp: 8}}\ntrain:\n  seq_len: {seq_len}\n"
                    f"  global_batch_tokens: {given}\n")
    base = {**BASE, "train": {"seq_len": seq_len, "global_batch_tokens": 8 * seq_len}}
    for run in (load_config(path), load_config(base, [f"train.global_batch_tokens={given}"]),
                load_config({**BASE, "train": train})):
        assert run.train.global_batch_tokens == tokens and isinstance(run.train.global_batch_tokens, int)
        assert run.train.global_batch_seqs_resolved == tokens // seq_len


@pytest.mark.parametrize("bad", ["4X", "-4M", "lots", "4Mx", "1.5", "4.0000001Ki", "true"])
def test_bad_global_batch_tokens_names_the_field(bad: str, capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    """A bad token count is a ConfigError on train.global_batch_tokens quoting the value and the valid forms."""
    base = {**BASE, "train": {"seq_len": 1024, "global_batch_tokens": 65536}}
    with pytest.raises(ConfigError) as err:
        load_config(base, [f"train.global_batch_tokens={bad}"])
    (problem,) = err.value.problems
    assert problem.path == "train.global_batch_tokens"
    assert bad.lower() in problem.message.lower() and "4Mi = 4,194,304" in problem.message
    path = tmp_path / "c.json"
    path.write_text(json.dumps(base))
    assert main(["simulate", str(path), "--set", f"train.global_batch_tokens={bad}"]) == 2
    err_text = capsys.readouterr().err
    assert "train.global_batch_tokens" in err_text and "Traceback" not in err_text


def test_constant_schedule_whole_steps() -> None:
    run = load_config(cfg({"tokens": "1M"}))
    (ph,) = resolve_phases(run)
    assert ph.batch_tokens == 64 * 1024
    assert ph.steps == math.ceil(1e6 / (64 * 1024))
    assert ph.tokens >= 1e6 > ph.tokens - ph.batch_tokens


def megatron_rampup(start: int, end: int, inc: int, ramp_samples: float, budget_samples: float) -> list[int]:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator, one step at a time: the batch per step."""
    n_inc = (end - start) // inc
    per_inc = ramp_samples / n_inc
    consumed, out = 0, []
    while consumed < budget_samples:
        b = end if consumed > ramp_samples else min(start + int(consumed / per_inc) * inc, end)
        out.append(b)
        consumed += b
    return out


def test_linear_ramp_matches_megatron_step_by_step() -> None:
    run = load_config(cfg({"tokens": 3000 * 1024, "batch_schedule": {"kind": "linear", "start_seqs": 16,
                                                                     "ramp_tokens": 1000 * 1024, "increments": 3}}))
    phases = resolve_phases(run)
    ours = [p.batch_seqs for p in phases for _ in range(p.steps)]
    assert ours == megatron_rampup(16, 64, 16, 1000, 3000)


def test_deepseek_v3_ramp_phases() -> None:
    """DeepSeek-V3 (arXiv:2412.19437 sec. 4.2): 3,072 -> 15,360 sequences of 4,096 over the first 469B tokens,
    then constant; 14.8T tokens. Pure schedule arithmetic (a dense stand-in model holds the layout)."""
    data = {**BASE, "model": "llama3-8b", "train": {"seq_len": 4096, "global_batch_seqs": 15360},
            "run": {"tokens": "14.8T", "batch_schedule": {"kind": "linear", "start_seqs": 3072,
                                                          "ramp_tokens": "469B", "increments": 8}}}
    phases = resolve_phases(load_config(data))
    assert [p.batch_seqs for p in phases] == [3072 + 1536 * k for k in range(9)]
    for k, p in enumerate(phases[:8]):
        assert k * 469e9 / 8 <= p.start_tokens < k * 469e9 / 8 + 3072 * 4096 * 5
    tail = phases[-1]
    assert 469e9 <= tail.start_tokens < 469e9 + 15360 * 4096
    total = sum(p.tokens for p in phases)
    assert 14.8e12 <= total < 14.8e12 + 15360 * 4096


def test_step_and_table_schedules() -> None:
    step = resolve_phases(load_config(cfg({"tokens": "10M", "batch_schedule": {"kind": "step", "start_seqs": 32,
                                                                              "ramp_tokens": "1M"}})))
    assert [p.batch_seqs for p in step] == [32, 64]
    table = {"kind": "table", "phases": [{"until_tokens": "1M", "global_batch_seqs": 16, "seq_len": 512},
                                         {"until_tokens": "2M", "global_batch_tokens": 32768}]}
    phases = resolve_phases(load_config(cfg({"tokens": "5M", "batch_schedule": table})))
    assert [(p.batch_seqs, p.seq_len) for p in phases] == [(16, 512), (32, 1024), (64, 1024)]


@pytest.mark.parametrize(("schedule", "path"), [
    ({"kind": "linear", "start_seqs": 16, "ramp_tokens": "1M"}, "run.batch_schedule.increments"),
    ({"kind": "linear", "start_seqs": 12, "ramp_tokens": "1M", "increment_seqs": 4},
     "run.batch_schedule.start_seqs"),
    ({"kind": "linear", "start_seqs": 16, "ramp_tokens": "1M", "increments": 5}, "run.batch_schedule.increments"),
    ({"kind": "step", "start_seqs": 16}, "run.batch_schedule.ramp_tokens"),
    ({"kind": "table", "phases": [{"until_tokens": "2M", "global_batch_seqs": 16},
                                  {"until_tokens": "1M", "global_batch_seqs": 32}]},
     "run.batch_schedule.phases[1].until_tokens"),
])
def test_bad_schedules_name_their_path(schedule: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_phases(load_config(cfg({"tokens": "10M", "batch_schedule": schedule})))
    assert path in {p.path for p in err.value.problems}, str(err.value)


def test_phase_not_divisible_by_layout() -> None:
    """12 sequences do not split over micro-batch 1 x dp 8: error on the schedule's field, both units shown."""
    with pytest.raises(ConfigError) as err:
        load_config(cfg({"tokens": "10M", "batch_schedule": {"kind": "step", "start_seqs": 12, "ramp_tokens": "1M"}}))
    (p,) = err.value.problems
    assert p.path == "run.batch_schedule.start_seqs"
    assert "12 sequences (12288 tokens)" in p.message and "1 x 8 = 8" in p.message


def test_simulate_run_caches_identical_phases() -> None:
    table = {"kind": "table", "phases": [{"until_tokens": "1Mi", "global_batch_seqs": 32},
                                         {"until_tokens": "2Mi", "global_batch_seqs": 64},
                                         {"until_tokens": "3Mi", "global_batch_seqs": 32}]}
    calls: list[int] = []

    def sim(run: RunConfig) -> StepResult:
        calls.append(run.train.global_batch_seqs_resolved)
        return fake_step(run)

    r = simulate_run(cfg({"tokens": "4Mi", "price_per_gpu_hour": 2.0, "batch_schedule": table}), simulate_fn=sim)
    assert sorted(calls) == [32, 64]  # four phases, two distinct configs
    assert r.simulations == 2 and len(r.phases) == 4
    assert r.time_to_train_s == pytest.approx(sum(p.steps * p.batch_seqs * 1e-3 for p in r.phases))
    assert r.gpu_hours == pytest.approx(r.time_to_train_s * 8 / 3600)
    assert r.cost == pytest.approx(2.0 * r.gpu_hours)
    assert r.tokens == pytest.approx(4 * 2**20)


def test_phase_config_is_the_step_config() -> None:
    run = load_config(cfg({"tokens": "1M"}))
    (ph,) = resolve_phases(run)
    one = phase_config(run, ph)
    assert one.run is None and one.train.global_batch_seqs == 64 and one.train.global_batch_tokens is None


def test_cli_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg({"tokens": "100M", "price_per_gpu_hour": 3.0,
                                    "batch_schedule": {"kind": "step", "start_seqs": 32, "ramp_tokens": "10M"}})))
    assert main(["run", str(path), "--json", "--out", str(tmp_path / "phases.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"time_to_train_s", "gpu_hours", "cost", "phases"} <= set(out)
    assert len(out["phases"]) == 2 and out["phases"][0]["batch_seqs"] == 32
    assert out["time_to_train_s"] == pytest.approx(sum(p["time_s"] for p in out["phases"]))
    assert out["cost"] == pytest.approx(3.0 * out["gpu_hours"])
    assert (tmp_path / "phases.csv").read_text().startswith("index,")


def test_cli_run_without_run_section_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ROOT / "examples" / "llama3_8b_h100_fsdp.yaml")]) == 2
    assert "run: missing" in capsys.readouterr().err
    assert main(["run", str(ROOT / "examples" / "llama3_8b_h100_fsdp.yaml"), "--tokens", "x"]) == 2
    assert "--tokens" in capsys.readouterr().err


def test_llama1_example_time_to_train() -> None:
    """The Llama 1 style example: within 15 % of the paper's ~21 days and 1,022,362 GPU-hours."""
    r = simulate_run(ROOT / "examples" / "llama1_65b_a100_run.yaml")
    assert r.n_gpus == 2048 and r.tokens >= 1.4e12
    assert r.time_to_train_days == pytest.approx(21, rel=0.15)
    assert r.gpu_hours == pytest.approx(1_022_362, rel=0.15)


class _Tty:
    """A stderr that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def test_run_progress_one_unit_per_phase_quiet_under_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """simulate_run draws a bar with an ETA when asked (one unit per phase) and nothing by default; on a
    terminal the CLI shows it, under --json it does not."""
    config = cfg({"tokens": "10M", "batch_schedule": {"kind": "step", "start_seqs": 32, "ramp_tokens": "1M"}})
    simulate_run(config, simulate_fn=fake_step)
    assert capsys.readouterr().err == ""
    simulate_run(config, simulate_fn=fake_step, progress=True)
    err = capsys.readouterr().err
    assert "simulating phases" in err and "2/2" in err and "ETA" in err
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.setattr("simtrain.studies.run._default_simulate", lambda mode: fake_step)
    assert main(["run", str(path), "--json"]) == 0
    assert tty.text == ""
    assert main(["run", str(path)]) == 0
    assert "simulating phases" in tty.text
