"""Subcommands ``simtrain import | export | schema`` and the config-source options of the others.

``import`` reads Megatron-LM / NeMo arguments or a torchtitan TOML job into a simtrain YAML config;
``export`` writes a config's layout as either; ``schema`` writes RunConfig's JSON Schema. ``add_source_options``
gives ``simulate``/``run``/``sweep``/``search`` ``--hf-config DIR_OR_ID`` (the model from a Hugging Face
config) and ``--format`` (a Megatron or torchtitan file as the config), and ``config_source`` applies them.
Bad input raises ConfigError, which ``simtrain.cli.main.main`` prints before exiting with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem

COMMANDS = ("import", "export", "schema")
FORMATS = ("megatron", "torchtitan")
#: File suffixes read as a framework config by ``--format auto``.
SUFFIXES = {".toml": "torchtitan", ".sh": "megatron", ".bash": "megatron", ".args": "megatron"}


def add_parsers(sub: Any) -> None:
    """Add the import/export/schema subparsers to ``simtrain``'s subparser group."""
    imp = sub.add_parser("import", help="read Megatron-LM/NeMo arguments or a torchtitan TOML job into a simtrain "
                                        "YAML config",
                         description="Read a framework's launch arguments (megatron: `--flag value` pairs as pasted "
                                     "from a launch script) or job config (torchtitan: TOML) into a simtrain config. "
                                     "Unknown flags or keys are listed as warnings. Neither format names the "
                                     "cluster: give --node/--nodes or a --base config.")  # fmt: skip
    imp.add_argument("format", choices=FORMATS, help="the framework the file is written for")
    imp.add_argument("file", help="Megatron arguments (text/shell) or torchtitan job (TOML)")
    _import_options(imp)
    imp.add_argument("-o", "--out", metavar="FILE", help="write the YAML config here (default: stdout)")
    imp.add_argument("--json", action="store_true", help="print the config and the unused flags as JSON")

    exp = sub.add_parser("export", help="write a config's model, layout and batch as Megatron-LM arguments or a "
                                        "torchtitan TOML job")  # fmt: skip
    exp.add_argument("config", help="path to a run config (YAML or JSON)")
    exp.add_argument("--to", choices=FORMATS, required=True, help="the framework to write for")
    exp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field by dotted path (repeatable)")
    exp.add_argument("-o", "--out", metavar="FILE", help="write here (default: stdout)")

    sch = sub.add_parser("schema", help="write the JSON Schema of a run config (for editors' YAML completion)")
    sch.add_argument("-o", "--out", metavar="FILE", help="write here (default: stdout)")


def _import_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", help="node preset of the cluster (simtrain hardware lists them)")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the base's, torchrun's --nnodes, else 1)")
    p.add_argument("--base", metavar="CONFIG", help="a simtrain config whose hardware, sim, run and other fields "
                                                    "the framework file does not set are kept")
    p.add_argument("--hf-config", metavar="DIR_OR_ID", help="the model from a Hugging Face config.json (a folder, "
                                                            "a file, or a model id in the local HF cache)")
    p.add_argument("--model", metavar="PRESET", help="the model as a simtrain preset (simtrain models)")
    p.add_argument("--name", help="the run's name")


def add_source_options(p: argparse.ArgumentParser) -> None:
    """``--hf-config`` and ``--format`` for a command that takes a config file."""
    p.add_argument("--hf-config", metavar="DIR_OR_ID",
                   help="replace the config's model by a Hugging Face config.json: a folder holding it, the file, "
                        "or a model id (org/name) already in the local HF cache ($HF_HOME/hub); nothing is downloaded")
    p.add_argument("--format", choices=("auto", "simtrain", *FORMATS), default="auto",
                   help="what the config file is: auto (default: .toml is torchtitan, .sh/.args Megatron "
                        "arguments, else simtrain YAML/JSON); a framework file takes its cluster from "
                        "--set hardware.node=... / hardware.n_nodes=...")  # fmt: skip


def _model_option(args: argparse.Namespace) -> Any:
    from simtrain.spec.hf_config import resolve_hf_source

    if getattr(args, "hf_config", None):
        return {"hf_config": str(resolve_hf_source(args.hf_config))}
    return getattr(args, "model", None)


def _read(fmt: str, path: str, **kwargs: Any) -> Any:
    from simtrain.formats import read_megatron_file, read_torchtitan_file

    return (read_megatron_file if fmt == "megatron" else read_torchtitan_file)(path, **kwargs)


def _warn(imported: Any, path: str) -> None:
    if imported.unknown:
        print(f"simtrain: warning: {path}: not understood, left out: {', '.join(imported.unknown)}", file=sys.stderr)
    for note in imported.notes:
        print(f"simtrain: note: {note}", file=sys.stderr)


def config_source(args: argparse.Namespace) -> str | dict[str, Any]:
    """The config a command simulates: the file's path, or a dict when --hf-config or --format apply.

    A framework file is imported with the cluster of the ``--set hardware.*`` overrides (which are applied
    again afterwards with the rest).
    """
    from simtrain.spec.config import read_config_file

    path = args.config
    fmt = getattr(args, "format", "auto")
    if fmt == "auto":
        fmt = SUFFIXES.get(Path(path).suffix.lower(), "simtrain")
    model = _model_option(args)
    if fmt in FORMATS:
        hw = {}
        for item in getattr(args, "overrides", []):
            key, sep, raw = item.partition("=")
            if sep and key.strip().startswith("hardware."):
                hw[key.strip().removeprefix("hardware.")] = yaml.safe_load(raw)
        imported = _read(fmt, path, base={"hardware": hw} if hw else None, model=model)
        _warn(imported, path)
        return imported.config.model_dump(mode="json")
    if model is None:
        return path
    data = read_config_file(path)
    data["model"] = model
    return data


def config_yaml(run: RunConfig) -> str:
    """A RunConfig as YAML, fields at their defaults left out, a preset model by its name."""
    from simtrain.spec.model import list_presets, preset

    data = run.model_dump(mode="json", exclude_defaults=True)
    data["hardware"] = {"node": run.hardware.node, **data.get("hardware", {})}  # say which node, even the default
    mine = run.model.model_dump(exclude={"name"})
    for name in list_presets():
        if preset(name).model_dump(exclude={"name"}) == mine:
            data["model"] = name
            break
    return yaml.safe_dump(data, sort_keys=False)


def run_command(args: argparse.Namespace) -> int:
    """Dispatch import/export/schema; returns the exit code."""
    return {"import": _cmd_import, "export": _cmd_export, "schema": _cmd_schema}[args.command](args)


def _emit(text: str, out: str | None) -> None:
    from simtrain.engine.trace import write_atomic

    if out:
        write_atomic(out, text)
    else:
        sys.stdout.write(text)


def _cmd_import(args: argparse.Namespace) -> int:
    if args.hf_config and args.model:
        raise ConfigError(Problem("--model", "give either --model or --hf-config, not both"))
    imported = _read(args.format, args.file, base=args.base, node=args.node, n_nodes=args.nodes, name=args.name,
                     model=_model_option(args))  # fmt: skip
    if args.json:
        print(json.dumps({"config": imported.config.model_dump(mode="json"), "unknown": list(imported.unknown),
                          "ignored": list(imported.ignored), "notes": list(imported.notes)}, indent=2))  # fmt: skip
        return 0
    _warn(imported, args.file)
    head = f"# simtrain config imported from {args.format} file {args.file}\n"
    _emit(head + config_yaml(imported.config), args.out)
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from simtrain.plan.load import load_config

    return export_config(load_config(args.config, args.overrides), args.to, args.out)


def export_config(run: RunConfig, fmt: str, out: str | None) -> int:
    """Write ``run`` as ``fmt`` (megatron or torchtitan) to ``out`` (stdout without); warn what has no flag."""
    from simtrain.formats import write_megatron, write_torchtitan

    text, skipped = (write_megatron if fmt == "megatron" else write_torchtitan)(run)
    for item in skipped:
        print(f"simtrain: warning: not expressible in {fmt}: {item}", file=sys.stderr)
    _emit(text, out)
    if out:
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from simtrain.spec.schema import run_config_schema

    _emit(json.dumps(run_config_schema(), indent=2) + "\n", args.out)
    return 0


def best_config(config: Any, overrides: list[str], result: Any) -> RunConfig:
    """The config of a search's best layout: the searched config on the result's GPUs, with its layout."""
    from simtrain.plan.load import load_config
    from simtrain.spec.config import LayoutConfig

    best = result.best
    if best is None:
        raise ConfigError(Problem("--export-best", "the search found no layout that fits; nothing to export"))
    run = load_config(config, overrides)
    per_node = run.hardware.gpus_per_node
    if per_node is None:
        from simtrain.hardware.load import load_node

        per_node = load_node(run.hardware.node, run.hardware.gpu).gpus_per_node
    hardware = run.hardware.model_copy(update={"n_nodes": result.n_gpus // per_node})
    train = run.train.model_copy(update={"micro_batch_size": best.micro_batch_size})
    chosen = run.model_copy(update={"hardware": hardware, "layout": LayoutConfig(**best.layout), "train": train})
    return load_config(chosen.model_dump(mode="json"))
