"""Issue 31, bad input: every malformed input is refused with exit code 2 and a message naming the field
or file, fast, without a traceback, through the CLI and the Python API alike."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simtrain import simulate
from simtrain.cli.main import main
from simtrain.plan.load import load_config
from simtrain.spec.config import apply_overrides
from simtrain.spec.errors import ConfigError
from simtrain.spec.limits import MAX_CONFIG_BYTES, MAX_GPUS, MAX_LAYERS, MAX_YAML_DEPTH
from simtrain.spec.safe_yaml import flow_depth, load_yaml

ROOT = Path(__file__).resolve().parents[1]
FSDP_8B = str(ROOT / "examples" / "llama3_8b_h100_fsdp.yaml")
A100 = str(ROOT / "examples" / "gpt3_175b_a100.yaml")
RUN_65B = str(ROOT / "examples" / "llama1_65b_a100_run.yaml")

#: Issue 31's bound on answering any malformed input.
LIMIT_S = 10.0


@contextlib.contextmanager
def within(seconds: float = LIMIT_S) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging when the body runs longer than ``seconds``."""
    def _expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.perf_counter()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - start < seconds


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """Run the CLI: exit code 2, every needle in stderr, no traceback, within ``LIMIT_S``; stderr."""
    with within():
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("simtrain: "), err
    for needle in needles:
        assert needle in err, err
    return err


def api_refused(config: Any, overrides: list[str], *needles: str) -> ConfigError:
    """The Python API raises ConfigError naming every needle, within ``LIMIT_S``."""
    with within(), pytest.raises(ConfigError) as err:
        simulate(config, overrides)
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    return err.value


# ---- files ----------------------------------------------------------------------------------------

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("latin1.yaml", b"name: caf\xe9\nmodel: llama3-8b\n", "not UTF-8"),
    ("self_alias.yaml", b"name: &a [*a]\nmodel: llama3-8b\n", "recursive alias"),
    ("bomb.yaml", ALIAS_BOMB.encode(), "alias bomb"),
    ("deep.yaml", b"[" * 5000 + b"]" * 5000, "nested deeper"),
    ("deep.json", b"[" * 100000 + b"]" * 100000, "nested deeper"),
    ("big_int.yaml", b"name: " + b"9" * 10000 + b"\n", "malformed YAML"),
    ("empty.yaml", b"", "not nothing"),
    ("list.yaml", b"- 1\n- 2\n", "not a list"),
    ("broken.json", b'{"name": "x",', "malformed JSON"),
    ("broken.yaml", b"name: [unclosed\n", "malformed YAML"),
    ("nul.yaml", b"\x00", "malformed YAML"),  # PyYAML's reader refuses it while the loader is built (fuzz)
])
def test_a_malformed_config_file_is_refused_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            name: str, content: bytes, needle: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    refused(["simulate", str(path)], capsys, "config: ", str(path), needle)
    api_refused(str(path), [], str(path), needle)


def test_a_directory_a_missing_file_and_an_oversized_file_are_refused(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    refused(["simulate", str(tmp_path)], capsys, "config: ", "is a directory")
    refused(["simulate", str(tmp_path / "nope.yaml")], capsys, "config: ", "file not found")
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * MAX_CONFIG_BYTES + "\n")
    refused(["simulate", str(big)], capsys, "config: ", f"at most {MAX_CONFIG_BYTES:,}")


def test_the_alias_bomb_is_refused_before_it_expands() -> None:
    with within(2.0), pytest.raises(ConfigError, match="alias bomb"):
        load_yaml(ALIAS_BOMB, "config")
    shared = "base: &b {tp: 2, pp: 2}\none: *b\ntwo: *b\n"  # ordinary anchors still work
    assert load_yaml(shared, "config") == {"base": {"tp": 2, "pp": 2}, "one": {"tp": 2, "pp": 2},
                                           "two": {"tp": 2, "pp": 2}}
    assert load_yaml("[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH, "x") is not None


def test_deep_flow_nesting_is_counted_on_the_brackets_before_pyyaml_scans_it() -> None:
    # fuzz seed 7 case 155: PyYAML's scanner is quadratic in an open flow collection's depth (1.5 CPU s at
    # 2,000 levels, 30 s of wall time on the loaded machine); the bracket count refuses it first
    deep = "model: " + "[" * 2000 + "]" * 2000
    assert flow_depth(deep) == 2000
    assert flow_depth("a: {b: [1, {c: 2}]}\nd: [x]") == 3
    assert flow_depth("name: 'x]]]'\nm: [1]") == 0  # unmatched closers only lower the count
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_YAML_DEPTH} levels"):
        load_yaml(deep, "config")
    assert load_yaml("a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1), "x") is not None

@pytest.mark.parametrize(("wrong", "needles"), [
    ({"model": [1, 2]}, ("model: [1, 2]",)),
    ({"layout": 3}, ("layout: 3",)),
    ({"layout": {"order": 5}}, ("layout.order",)),
    ({"train": {"stack": 5}}, ("train.stack",)),
    ({"model": {"hf_config": 5}}, ("model", "hf_config 5")),
    ({"model": {"preset": "llama3-8b", "moe": 5}}, ("model.moe",)),
])
def test_wrong_types_at_any_level_are_refused_with_the_path(wrong: dict[str, Any], needles: tuple[str, ...]) -> None:
    from simtrain.spec.config import read_config_file

    data = {**read_config_file(FSDP_8B), **wrong}
    api_refused(data, [], *needles)


def test_a_run_config_without_a_global_batch_is_refused_not_an_assertion(capsys: pytest.CaptureFixture[str]) -> None:
    refused(["run", RUN_65B, "--set", "train.global_batch_tokens=null"], capsys, "train.global_batch_tokens",
            "give exactly one")


def test_a_config_that_is_not_a_path_or_mapping_is_refused() -> None:
    with pytest.raises(ConfigError, match="a list is not a config"):
        load_config([1, 2])  # type: ignore[arg-type]


# ---- --set values ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("override", "needles"), [
    ("layout.tp=[1,2", ("--set layout.tp", "malformed YAML")),
    ("layout.tp=&a [*a]", ("--set layout.tp", "recursive alias")),
    ("a..b=1", ("--set", "empty part")),
    ("name.x=1", ("name:", "not a mapping")),
])
def test_a_malformed_set_value_is_refused(capsys: pytest.CaptureFixture[str], override: str,
                                          needles: tuple[str, ...]) -> None:
    refused(["simulate", FSDP_8B, "--set", override], capsys, *needles)
    api_refused(FSDP_8B, [override], *needles)


def test_a_dotted_override_into_a_preset_name_keeps_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert apply_overrides({"model": "llama3-8b"}, ["model.n_layers=40"]) == {
        "model": {"preset": "llama3-8b", "n_layers": 40}}
    run = load_config(FSDP_8B, ["model.n_layers=40"])
    base = load_config(FSDP_8B)
    assert run.model.n_layers == 40 and run.model.hidden == base.model.hidden == 4096
    assert main(["simulate", FSDP_8B, "--set", "model.n_layers=40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_gpus"] == 8


# ---- strict counts --------------------------------------------------------------------------------

@pytest.mark.parametrize(("override", "path"), [
    ("layout.tp=true", "layout.tp"),
    ("layout.dp=yes", "layout.dp"),
    ("layout.zero_stage=true", "layout.zero_stage"),
    ("model.n_layers=true", "model.n_layers"),
    ("train.micro_batch_size=false", "train.micro_batch_size"),
    ("hardware.n_nodes=true", "hardware.n_nodes"),
])
def test_a_boolean_is_not_a_count(capsys: pytest.CaptureFixture[str], override: str, path: str) -> None:
    refused(["simulate", FSDP_8B, "--set", override], capsys, f"{path}: ", "a yes/no value is not a count; give a whole number")


@pytest.mark.parametrize(("override", "path"), [("layout.dp=7.5", "layout.dp"), ("train.seq_len=4096.5", "train.seq_len"),
                                                ("model.n_layers=2.5", "model.n_layers")])
def test_a_fractional_count_is_refused(override: str, path: str) -> None:
    api_refused(FSDP_8B, [override], f"{path}: ")


def test_an_integral_float_is_still_a_count() -> None:
    assert load_config(FSDP_8B, ["train.seq_len=8192.0"]).train.seq_len == 8192


# ---- sizes no real run approaches -----------------------------------------------------------------

@pytest.mark.parametrize(("override", "path"), [
    ("train.global_batch_tokens=1e30", "train.global_batch_tokens"),
    ("model={preset: llama3-70b, n_layers: 1000000000000000000000000000000}", "model.n_layers"),
    (f"model={{preset: llama3-8b, n_layers: {MAX_LAYERS + 1}}}", "model.n_layers"),
    ("model={preset: llama3-8b, hidden: 100000000000}", "model.hidden"),
    ("model={preset: llama3-8b, vocab: 1000000000000}", "model.vocab"),
    ("train.seq_len=10000000000", "train.seq_len"),
    ("train.micro_batch_size=100000000", "train.micro_batch_size"),
    (f"layout.dp={MAX_GPUS + 1}", "layout.dp"),
    ("hardware.n_nodes=1000000", "hardware.n_nodes"),
    ("train.global_batch_tokens=786432000000", "train.global_batch_tokens"),  # 1.2 x 10^7 micro-batches
])
def test_sizes_no_run_approaches_are_refused_at_once(capsys: pytest.CaptureFixture[str], override: str,
                                                     path: str) -> None:
    refused(["simulate", FSDP_8B, "--set", override], capsys, f"{path}: ")
    api_refused(FSDP_8B, [override], f"{path}: ")


def test_the_pipeline_chunks_are_bounded_too() -> None:
    api_refused(FSDP_8B, ["layout.vpp=100000", "layout.pp=2", "layout.dp=4"], "layout.vpp: ")


# ---- layers per pipeline chunk --------------------------------------------------------------------

def test_dualpipev_with_a_layerless_middle_chunk_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", FSDP_8B, "--set", "model={preset: llama3-8b, n_layers: 4}", "--set", "layout.fsdp=none",
            "--set", "layout.pp=4", "--set", "layout.dp=2", "--set", "layout.schedule=dualpipev"]
    refused(argv, capsys, "layout.schedule: ", "2 x pp - 2 = 6 layers", "model.n_layers=4")


@pytest.mark.parametrize(("schedule", "vpp", "fewest"), [
    ("gpipe", 1, 4), ("1f1b", 1, 4), ("zb_h1", 1, 4), ("interleaved_1f1b", 2, 6), ("dualpipe", 1, 4),
    ("dualpipev", 1, 6),
])
def test_every_schedule_refuses_too_few_layers_and_simulates_every_layer_it_accepts(
        schedule: str, vpp: int, fewest: int) -> None:
    """Below ``fewest`` layers (pp = 4) a chunk other than the first or last would be empty: refused. At
    ``fewest`` every layer is simulated: the hardware FLOPs (what the simulated kernels ran) are at
    least the model FLOPs of all layers, i.e. HFU >= MFU (with a layer missing MFU ran to 668 %)."""
    def overrides(layers: int) -> list[str]:
        return [f"model={{preset: llama3-8b, n_layers: {layers}}}", "layout.fsdp=none", "layout.recompute=none",
                "layout.pp=4", "layout.dp=2", f"layout.schedule={schedule}", f"layout.vpp={vpp}"]

    api_refused(FSDP_8B, overrides(fewest - 1), "layout.")
    for layers in (fewest, fewest + 1):
        r = simulate(FSDP_8B, overrides(layers))
        assert r.hfu >= r.mfu > 0 and r.mfu < 1, (layers, r.mfu, r.hfu)


# ---- messages carry the full dotted path ----------------------------------------------------------

def test_fp8_on_a_gpu_without_fp8_names_train_precision(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["simulate", A100, "--set", "train.precision=fp8"], capsys, "train.precision: ", "a100")
    assert " precision: " not in err.replace("train.precision: ", "")


def test_a_long_ramp_lists_a_few_problems_and_too_many_levels_are_refused() -> None:
    ramp = "run.batch_schedule={kind: linear, start_seqs: 8, ramp_tokens: 1e9, increment_seqs: 1}"
    err = api_refused(RUN_65B, [ramp], "... and 2,003 more like these")
    assert len(err.problems) == 7  # start_seqs, five increments, the count of the rest (was 2,040 lines)
    many = ("run.batch_schedule={kind: linear, start_seqs: 64, ramp_tokens: 1e9, increment_seqs: 64}",
            "train.global_batch_tokens=1342177280")  # 655,360 sequences of 2,048: 10,239 levels of 64
    api_refused(RUN_65B, list(many), "run.batch_schedule.increment_seqs: ", "at most 10,000")
