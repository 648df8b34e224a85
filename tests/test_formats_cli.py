"""CLI of the users' formats: import, export, schema, --hf-config, --format and search --export-best."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from simtrain.cli.main import main
from simtrain.formats import read_megatron_file, read_torchtitan_file
from simtrain.plan.load import load_config
from simtrain.spec.model import preset

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
MEGATRON = str(DATA / "megatron" / "llama3_8b_pretrain.sh")
TORCHTITAN = str(DATA / "torchtitan" / "llama3_8b.toml")
TINY = dict(name="tiny", n_layers=4, hidden=256, n_heads=4, ffn_hidden=1024, activation="gelu",
            norm="layernorm", position="rope", vocab=1024, tied_embeddings=False, linear_bias=False)  # fmt: skip


def _tiny(tmp_path: Path) -> str:
    cfg = dict(model=TINY, hardware=dict(n_nodes=1), layout=dict(dp=8), train=dict(seq_len=512, global_batch_seqs=16))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_import_megatron_writes_a_config_that_loads_to_the_same_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cfg.yaml"
    assert main(["import", "megatron", MEGATRON, "--node", "dgx-h100", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--my-experimental-flag" in err and "warning" in err
    text = out.read_text()
    assert "model: llama3.1-8b" in text  # a preset's dims are written as its name
    expected = read_megatron_file(MEGATRON, node="dgx-h100").config
    skip = {"name": True, "model": {"name"}}
    assert load_config(out).model_dump(exclude=skip) == expected.model_dump(exclude=skip)


def test_import_torchtitan_json_lists_unknown_and_ignored(capsys) -> None:
    assert main(["import", "torchtitan", TORCHTITAN, "--nodes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["layout"]["fsdp"] == "hybrid" and out["config"]["hardware"]["n_nodes"] == 2
    assert "parallelism.fsdp_reshard_after_forward" in out["unknown"] and "optimizer.lr" in out["ignored"]


def test_import_errors_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["import", "megatron", str(tmp_path / "nope.sh")]) == 2
    assert "megatron" in capsys.readouterr().err
    assert main(["import", "torchtitan", TORCHTITAN, "--nodes", "0"]) == 2
    assert "--nodes: 0 is not valid" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_export_then_import_round_trip_through_the_cli(fmt: str, tmp_path: Path, capsys) -> None:
    example = str(ROOT / "examples" / "llama3_8b_h100_fsdp.yaml")
    target = tmp_path / ("job.toml" if fmt == "torchtitan" else "args.sh")
    assert main(["export", example, "--to", fmt, "-o", str(target)]) == 0
    capsys.readouterr()
    back = tmp_path / "back.yaml"
    assert main(["import", fmt, str(target), "--base", example, "-o", str(back)]) == 0
    run, again = load_config(example), load_config(back)
    assert (again.layout.dp, again.layout.fsdp, again.train.seq_len) == (run.layout.dp, run.layout.fsdp, 8192)
    assert again.train.global_batch_seqs_resolved == run.train.global_batch_seqs_resolved


def test_simulate_takes_framework_files_directly(capsys) -> None:
    assert main(["simulate", TORCHTITAN, "--set", "hardware.n_nodes=2", "--set", "train.global_batch_seqs=32",
                 "--json"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["n_gpus"] == 16 and out["layout"]["fsdp"] == "hybrid"
    assert "fsdp_reshard_after_forward" in captured.err
    assert main(["simulate", MEGATRON, "--set", "train.global_batch_seqs=32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_gpus"] == 16 and out["layout"]["vpp"] == 4  # torchrun --nnodes 2 from the script


def test_hf_config_flag_replaces_the_model(tmp_path: Path, capsys) -> None:
    import argparse

    from simtrain.cli.formats import config_source

    folder = tmp_path / "Llama-3-8B"
    shutil.copytree(DATA / "hf" / "llama3-8b", folder)
    tiny = _tiny(tmp_path)
    args = argparse.Namespace(config=tiny, format="auto", hf_config=str(folder), overrides=[])
    source = config_source(args)
    assert isinstance(source, dict) and source["model"] == {"hf_config": str(folder)}
    run = load_config(source)
    assert run.model.param_count() == preset("llama3-8b").param_count()
    assert run.layout == load_config(tiny).layout and run.train == load_config(tiny).train
    assert main(["simulate", tiny, "--hf-config", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_gpus"] == 8


def test_hf_config_model_id_from_the_local_cache(tmp_path: Path, monkeypatch, capsys) -> None:
    snapshot = tmp_path / "hub" / "models--meta-llama--Meta-Llama-3-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(DATA / "hf" / "llama3-8b" / "config.json", snapshot / "config.json")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert main(["simulate", _tiny(tmp_path), "--hf-config", "meta-llama/Meta-Llama-3-8B", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_gpus"] == 8
    assert main(["simulate", _tiny(tmp_path), "--hf-config", "meta-llama/Not-Cached"]) == 2
    err = capsys.readouterr().err
    assert "--hf-config: 'meta-llama/Not-Cached' is not valid" in err and str(tmp_path / "hub") in err
    assert main(["sweep", _tiny(tmp_path), "--hf-config", str(tmp_path / "missing"), "--grid", "layout.dp=8"]) == 2
    assert "missing" in capsys.readouterr().err


def _keys_in_schema(schema: dict, data: dict) -> list[str]:
    """Keys of a config (two levels) the schema does not name: the structure check without jsonschema."""
    refs = {name: schema["properties"][name] for name in schema["properties"]}
    out = [k for k in data if k not in schema["properties"]]
    for key, value in data.items():
        ref = next((r["$ref"] for r in [refs.get(key, {}), *refs.get(key, {}).get("anyOf", [])] if "$ref" in r), None)
        if isinstance(value, dict) and ref is not None:
            props = schema["$defs"][ref.rsplit("/", 1)[1]]["properties"]
            out += [f"{key}.{k}" for k in value if k not in props and k not in ("preset", "hf_config")]
    return out


def test_schema_command(tmp_path: Path) -> None:
    out = tmp_path / "schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    schema = json.loads(out.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    examples = {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "examples").glob("*.yaml"))}
    for name, data in examples.items():
        assert _keys_in_schema(schema, data) == [], name
    bad = dict(examples["llama3_70b_h100.yaml"], layout={"tpp": 2})
    assert _keys_in_schema(schema, bad) == ["layout.tpp"]
    try:
        import jsonschema
    except ImportError:  # the structure check above stands in
        return
    validator = jsonschema.Draft202012Validator(schema)
    for name, data in examples.items():
        assert [e.message for e in validator.iter_errors(data)] == [], name
    assert not validator.is_valid(bad)
    assert validator.is_valid({"model": {"hf_config": "cfg/"}, "train": {"global_batch_tokens": "4Mi"}})
    assert not validator.is_valid({"model": "llama3-70b", "train": {"global_batch_tokens": "four"}})


def test_schema_describes_every_field() -> None:
    from simtrain.spec.schema import run_config_schema

    schema = run_config_schema()
    nodes = {"RunConfig": schema, **schema["$defs"]}
    missing = [f"{name}.{field}" for name, node in nodes.items()
               for field, prop in node.get("properties", {}).items() if not prop.get("description")]  # fmt: skip
    assert missing == []
    assert set(schema["$defs"]) >= {"ModelSpec", "MoESpec", "MLASpec", "LayoutConfig", "TrainConfig", "RunSpec"}


def test_search_export_best(tmp_path: Path, capsys) -> None:
    target = tmp_path / "best.sh"
    assert main(["search", _tiny(tmp_path), "--tp", "1,2", "--pp", "1", "--cp", "1", "--mbs", "1", "--zero", "0",
                 "--recompute", "none", "--top", "2", "--workers", "1", "--no-progress",
                 "--export-best", "megatron", str(target)]) == 0  # fmt: skip
    capsys.readouterr()
    assert target.is_file()
    best = read_megatron_file(target, base=_tiny(tmp_path)).config
    assert best.layout.tp in (1, 2) and best.layout.dp * best.layout.tp == 8
    assert main(["search", _tiny(tmp_path), "--export-best", "deepspeed", str(target)]) == 2
    assert "--export-best" in capsys.readouterr().err


def test_torchtitan_fixture_and_megatron_fixture_describe_the_same_model() -> None:
    tt = read_torchtitan_file(TORCHTITAN, node="dgx-h100", n_nodes=2).config
    mg = read_megatron_file(MEGATRON, node="dgx-h100").config
    assert tt.model.param_count() == mg.model.param_count() == preset("llama3.1-8b").param_count()
