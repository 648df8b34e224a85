"""torchtitan TOML job configs to and from a RunConfig.

Section and key names, defaults and meanings are torchtitan's ``torchtitan/config/job_config.py``
(pytorch/torchtitan, 2025): ``[parallelism]`` ``data_parallel_replicate_degree`` (1) x
``data_parallel_shard_degree`` (-1: what the other degrees leave) is the data-parallel degree, sharded
with FSDP2 over the shard degree (HSDP when both exceed 1); ``tensor_parallel_degree`` always runs with
sequence parallelism on the norms (``parallelize_llama``), ``enable_async_tensor_parallel`` overlaps its
collectives; ``pipeline_parallel_schedule`` names a ``torch.distributed.pipelining`` schedule, with
``pipeline_parallel_layers_per_stage`` layers per stage (default: one stage per rank, two for the
multi-stage schedules); ``[training]`` ``local_batch_size`` (``batch_size`` before 2025) sequences per
data-parallel rank, ``global_batch_size`` (-1: local x dp) and ``seq_len``; ``[activation_checkpoint]``
``mode`` none/selective/full with ``selective_ac_option`` "op" or a layer period ("2": every second
layer); ``[compile]`` ``enable`` with ``components`` (model, loss); float8 through ``[model] converters``
containing "float8" (``[float8] enable_float8_linear`` before 2025), tensorwise scaling unless
``[float8] recipe_name`` says otherwise.

The model is a ``[model] name``/``flavor`` from torchtitan's model registry (the flavors mapped below),
the ``config.json`` under ``[model] hf_assets_path``, or a model given by the caller.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

from simtrain.formats.common import (
    Imported,
    base_data,
    data_parallel,
    finish,
    hardware_data,
    merge,
    model_layers,
    read_text,
    world_size,
)
from simtrain.plan.schedules import ScheduleKind
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem, problem

__all__ = ["FLAVORS", "read_torchtitan", "read_torchtitan_file", "write_torchtitan"]

#: torchtitan (model name, flavor) -> simtrain preset with the same dims (torchtitan/models/llama3/__init__.py
#: ``llama3_args``; models/deepseek_v3/__init__.py ``deepseekv3_args``; torchtitan's DeepSeek-V3 has no MTP module).
FLAVORS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("llama3", "8B"): ("llama3.1-8b", {}),
    ("llama3", "70B"): ("llama3.1-70b", {}),
    ("llama3", "405B"): ("llama3.1-405b", {}),
    ("deepseek_v3", "671B"): ("deepseek-v3", {"mtp_depth": 0}),
}
_SCHEDULES = {"1F1B": ScheduleKind.ONE_F_ONE_B, "Interleaved1F1B": ScheduleKind.INTERLEAVED_1F1B,
              "GPipe": ScheduleKind.GPIPE, "DualPipeV": ScheduleKind.DUALPIPEV}
_MULTI_STAGE = ("Interleaved1F1B", "DualPipeV")
_USED = {
    "job": {"description"},
    "model": {"name", "flavor", "hf_assets_path", "converters", "tokenizer_path"},
    "training": {"local_batch_size", "batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree", "enable_async_tensor_parallel"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components"},
    "float8": {"enable_float8_linear", "recipe_name"},
    "optimizer": {"name"},
}  # fmt: skip
#: Keys of the sections above that change no step time or memory (steps, data, learning rate, ...).
_IGNORED_KEYS = {
    "model": {"tokenizer_path", "print_after_conversion"},
    "training": {"steps", "max_norm", "dataset", "dataset_path", "seed", "deterministic", "gc_freq",
                 "enable_cpu_offload", "warmup_steps"},
    "optimizer": {"lr", "eps", "weight_decay", "beta1", "beta2", "implementation", "early_step_in_backward",
                  "min_lr_factor"},
    "compile": {"backend"},
}  # fmt: skip
#: Sections that change no step time or memory (logging, checkpoints, data, learning-rate schedule).
_IGNORED_SECTIONS = ("job", "profiling", "metrics", "checkpoint", "lr_scheduler", "comm", "validation",
                     "fault_tolerance", "experimental", "memory_estimation", "mx")  # fmt: skip


class _Toml:
    """Typed access to a parsed job config; records used keys and collects every bad value."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.problems: list[Problem] = []

    def get(self, section: str, key: str, kind: Any, default: Any) -> Any:
        value = (self.data.get(section) or {}).get(key, default)
        if value is default:
            return value
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            self.problems.append(problem(f"{section}.{key}", value, "an integer"))
            return default
        if kind is not int and not isinstance(value, kind):
            what = "a string or an integer" if isinstance(kind, tuple) else f"a {kind.__name__}"
            self.problems.append(problem(f"{section}.{key}", value, what))
            return default
        return value


def _model(t: _Toml, base_model: Any, source_dir: Path | None, notes: list[str]) -> Any:
    """The model: the hf_assets_path's config.json, a mapped flavor, else the base's."""
    name, flavor = t.get("model", "name", str, None), t.get("model", "flavor", str, None)
    assets = t.get("model", "hf_assets_path", str, None)
    if assets is not None:
        folder = Path(assets) if Path(assets).is_absolute() or source_dir is None else source_dir / assets
        if (folder / "config.json").is_file():
            return {"hf_config": str(folder), "name": f"{name}-{flavor}" if name and flavor else None}
    if name is not None and flavor is not None and (name, flavor) in FLAVORS:
        from simtrain.spec.model import preset

        preset_name, update = FLAVORS[(name, flavor)]
        if update:
            notes.append(f"model {name} {flavor}: {', '.join(f'{k}={v}' for k, v in update.items())} "
                         "(torchtitan's model has no such part)")  # fmt: skip
        return {**preset(preset_name).model_dump(mode="json"), **update}
    if base_model is not None:
        return base_model
    known = ", ".join(f"{n}/{f}" for n, f in FLAVORS)
    t.problems.append(problem("model.flavor", f"{name}/{flavor}", f"a mapped flavor ({known}), a [model] "
                              "hf_assets_path holding config.json, or a model given with --hf-config/--model"))
    return None


def _layout(t: _Toml, world: int, n_layers: int | None, notes: list[str]) -> dict[str, Any]:
    """The ``layout`` section from ``[parallelism]`` and ``[activation_checkpoint]``."""
    p = "parallelism"
    tp, pp = t.get(p, "tensor_parallel_degree", int, 1), t.get(p, "pipeline_parallel_degree", int, 1)
    cp, ep = t.get(p, "context_parallel_degree", int, 1), t.get(p, "expert_parallel_degree", int, 1)
    replicate, shard = t.get(p, "data_parallel_replicate_degree", int, 1), t.get(p, "data_parallel_shard_degree", int, -1)
    if shard == -1:
        shard = data_parallel(world, replicate * tp * pp * cp, f"{p}.data_parallel_shard_degree",
                              "replicate x tp x pp x cp")  # fmt: skip
    dp = replicate * shard
    layout: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "sequence_parallel": tp > 1,
                              "tp_comm_overlap": t.get(p, "enable_async_tensor_parallel", bool, False)}  # fmt: skip
    if "expert_tensor_parallel_degree" in (t.data.get(p) or {}):
        layout["etp"] = t.get(p, "expert_tensor_parallel_degree", int, 1)
    if shard > 1:
        layout["fsdp"] = "full" if replicate == 1 else "hybrid"
        if replicate > 1:
            layout["fsdp_shard_size"] = shard
    rotate = t.get(p, "context_parallel_rotate_method", str, "allgather")
    if cp > 1:
        layout["cp_comm"] = {"allgather": "all_gather", "alltoall": "p2p"}.get(rotate, "p2p")
    if rotate not in ("allgather", "alltoall"):
        t.problems.append(problem(f"{p}.context_parallel_rotate_method", rotate, "allgather or alltoall"))
    schedule = t.get(p, "pipeline_parallel_schedule", str, "1F1B")
    if pp > 1:
        if schedule not in _SCHEDULES:
            t.problems.append(problem(f"{p}.pipeline_parallel_schedule", schedule, f"one of {', '.join(_SCHEDULES)}"))
        if _SCHEDULES.get(schedule) in (ScheduleKind.GPIPE, ScheduleKind.DUALPIPEV):  # (interleaved) 1F1B: auto
            layout["schedule"] = _SCHEDULES[schedule].value
        per_stage = t.get(p, "pipeline_parallel_layers_per_stage", int, None)
        stages = 2 if schedule in _MULTI_STAGE else 1
        if per_stage is not None and n_layers:
            if n_layers % (pp * per_stage):
                t.problems.append(problem(f"{p}.pipeline_parallel_layers_per_stage", per_stage,
                                          f"a divisor of the {n_layers} layers / pp {pp}"))  # fmt: skip
            else:
                stages = n_layers // (pp * per_stage)
        if schedule == "Interleaved1F1B":
            layout["vpp"] = stages
    _recompute(t, layout, n_layers, notes)
    return layout


def _recompute(t: _Toml, layout: dict[str, Any], n_layers: int | None, notes: list[str]) -> None:
    """``[activation_checkpoint]``: none, full, op-level SAC, or every n-th layer (as full on 1/n of them)."""
    a = "activation_checkpoint"
    mode, option = t.get(a, "mode", str, "selective"), str(t.get(a, "selective_ac_option", (str, int), "2"))
    if mode == "full":
        layout["recompute"] = "full"
    elif mode == "selective" and option == "op":
        layout["recompute"] = "op_sac"
    elif mode == "selective" and option.isdigit() and int(option) >= 1:
        period = int(option)
        chunk = (n_layers or 0) // (layout["pp"] * layout.get("vpp", 1))
        layout["recompute"] = "full" if period == 1 or chunk else "none"
        if period > 1 and chunk:
            layout["recompute_layers"] = math.ceil(chunk / period)
            notes.append(f"activation_checkpoint selective_ac_option {option!r} (one layer in {period}): simulated "
                         f"as full recompute of {layout['recompute_layers']} of each stage chunk's {chunk} layers")
    elif mode != "none":
        t.problems.append(problem(f"{a}.mode", f"{mode}/{option}", "none, full, or selective with "
                                                                   "selective_ac_option 'op' or a layer period"))


def _train(t: _Toml, dp: int, pp: int, notes: list[str]) -> dict[str, Any]:
    """The ``train`` section from ``[training]``, ``[compile]``, float8 and ``[optimizer]``."""
    tr = "training"
    local = t.get(tr, "local_batch_size", int, None) or t.get(tr, "batch_size", int, 8)
    glob = t.get(tr, "global_batch_size", int, -1)
    train: dict[str, Any] = {
        "seq_len": t.get(tr, "seq_len", int, 2048),
        "micro_batch_size": t.get("parallelism", "pipeline_parallel_microbatch_size", int, 1) if pp > 1 else local,
        "global_batch_seqs": glob if glob > 0 else local * dp,
        "grad_dtype": "bf16" if t.get(tr, "mixed_precision_reduce", str, "float32") == "bfloat16" else "fp32",
    }  # fmt: skip
    if t.get(tr, "mixed_precision_param", str, "bfloat16") != "bfloat16":
        notes.append("training.mixed_precision_param other than bfloat16: simulated as bf16")
    compiled = t.get("compile", "enable", bool, False)
    components = t.get("compile", "components", list, ["model", "loss"])
    train["stack"] = "torchtitan-eager"
    if compiled:  # torchtitan 2024 compiled the blocks only; simtrain.spec.stacks "torchtitan-compile-2024"
        train["stack"] = "torchtitan-compile" if "loss" in components else "torchtitan-compile-2024"
    converters = t.get("model", "converters", list, [])
    if "float8" in converters or t.get("float8", "enable_float8_linear", bool, False):
        train["precision"], train["fp8_recipe"] = "fp8", "current"
        recipe = t.get("float8", "recipe_name", str, "tensorwise")
        if recipe != "tensorwise":
            notes.append(f"float8.recipe_name {recipe!r}: simulated as tensorwise current scaling")
    optimizer = t.get("optimizer", "name", str, "AdamW")
    train["optimizer"] = {"AdamW": "adamw", "Adam": "adam"}.get(optimizer, "adamw")
    if optimizer not in ("AdamW", "Adam"):
        t.problems.append(problem("optimizer.name", optimizer, "AdamW or Adam"))
    return train


def read_torchtitan(text: str, *, base: RunConfig | dict[str, Any] | str | Path | None = None,
                    node: str | None = None, n_nodes: int | None = None, name: str | None = None,
                    model: Any = None, source_dir: Path | None = None) -> Imported:
    """A RunConfig from a torchtitan TOML job config (text).

    Args:
        text: the TOML job config.
        base: a config whose hardware, model (when the job has no mapped flavor), sim and run sections
            are kept; its layout and train sections are replaced by the job's.
        node, n_nodes: the cluster, over the base's.
        name: the run's name (default: the job's ``[job] description``, else the base's, else "torchtitan").
        model: a model (preset name, ``{"hf_config": path}``, ModelSpec or dict) used instead of the job's.
        source_dir: where a relative ``hf_assets_path`` starts (the TOML file's folder).

    Raises:
        ConfigError: malformed TOML, or every bad value with its ``section.key``.
    """
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(Problem("torchtitan", f"not valid TOML: {exc}")) from None
    t = _Toml(job)
    notes: list[str] = []
    data = base_data(base)
    hw = hardware_data(data, node, n_nodes)
    chosen = model if model is not None else _model(t, data.get("model"), source_dir, notes)
    if t.problems:
        raise ConfigError(t.problems)
    layout = _layout(t, world_size(hw), model_layers(chosen), notes)
    train = _train(t, layout["dp"], layout["pp"], notes)
    if t.problems:
        raise ConfigError(t.problems)
    job_name = (job.get("job") or {}).get("description")
    data.update(name=name or job_name or data.get("name") or "torchtitan", model=chosen, hardware=hw)
    merge(data, "layout", layout)
    merge(data, "train", train)
    unknown: list[str] = []
    ignored: list[str] = []
    for section, values in job.items():
        keys = values.items() if isinstance(values, dict) else [("", values)]
        for key, _ in keys:
            where = f"{section}.{key}" if key else section
            if key in _USED.get(section, ()):
                continue
            known = section in _IGNORED_SECTIONS or key in _IGNORED_KEYS.get(section, ())
            (ignored if known else unknown).append(where)
    return finish(data, unknown, ignored, notes)


def read_torchtitan_file(path: str | Path, **kwargs: Any) -> Imported:
    """``read_torchtitan`` of a file; a relative ``hf_assets_path`` starts at the file's folder."""
    text, _ = read_text(path, "torchtitan")  # named by [job] description, else the base's
    return read_torchtitan(text, source_dir=Path(path).resolve().parent, **kwargs)


# ---- export ------------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def _flavor(run: RunConfig) -> tuple[str, str] | None:
    """The torchtitan (name, flavor) whose dims are the run's model, if one is mapped."""
    from simtrain.spec.model import preset

    mine = run.model.model_dump(exclude={"name"})
    for key, (preset_name, update) in FLAVORS.items():
        if {**preset(preset_name).model_dump(exclude={"name"}), **update} == mine:
            return key
    return None


def write_torchtitan(run: RunConfig) -> tuple[str, list[str]]:
    """(TOML text, fields with no torchtitan key) of a RunConfig; the text lists the latter as comments."""
    lay, tr, skipped = run.layout, run.train, []
    sections: dict[str, dict[str, Any]] = {"job": {"description": run.name}}
    flavor = _flavor(run)
    if flavor is not None:
        sections["model"] = {"name": flavor[0], "flavor": flavor[1]}
    else:
        skipped.append(f"model {run.model.name}: no mapped torchtitan flavor (give it again on import)")
        sections["model"] = {}
    if tr.precision == "fp8":
        sections["model"]["converters"] = ["float8"]
        if tr.fp8_recipe != "current":
            skipped.append(f"train.fp8_recipe {tr.fp8_recipe}: torchtitan scales tensorwise")
    elif tr.precision == "fp16":
        skipped.append("train.precision fp16: torchtitan trains in bfloat16")
    elif tr.precision == "fp4":
        skipped.append("train.precision fp4: no torchtitan NVFP4 training converter is modelled")
    shard, replicate = (lay.dp, 1) if lay.fsdp == "full" else (1, lay.dp)
    if lay.fsdp == "hybrid":
        shard = lay.fsdp_shard_size or lay.dp
        replicate = lay.dp // shard
    if lay.fsdp == "none" and lay.zero_stage:
        skipped.append(f"layout.zero_stage {lay.zero_stage}: torchtitan has FSDP or DDP, written as DDP")
    par: dict[str, Any] = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                           "tensor_parallel_degree": lay.tp, "enable_async_tensor_parallel": lay.tp_comm_overlap,
                           "pipeline_parallel_degree": lay.pp, "context_parallel_degree": lay.cp,
                           "expert_parallel_degree": lay.ep}  # fmt: skip
    if run.model.moe is not None:
        par["expert_tensor_parallel_degree"] = lay.expert_tp
    if lay.tp > 1 and not lay.sequence_parallel:
        skipped.append("layout.sequence_parallel false: torchtitan's TP is always sequence-parallel")
    if lay.cp > 1:
        par["context_parallel_rotate_method"] = "allgather" if lay.cp_comm == "all_gather" else "alltoall"
    glob = tr.global_batch_seqs_resolved
    if lay.pp > 1:
        names: dict[str, str] = {v: k for k, v in _SCHEDULES.items()}
        schedule = lay.resolved_schedule
        if schedule not in names:
            skipped.append(f"layout.schedule {schedule}: written as 1F1B")
        par["pipeline_parallel_schedule"] = names.get(schedule, "1F1B")
        par["pipeline_parallel_microbatch_size"] = tr.micro_batch_size
        if lay.vpp > 1 and run.model.n_layers % (lay.pp * lay.vpp) == 0:
            par["pipeline_parallel_layers_per_stage"] = run.model.n_layers // (lay.pp * lay.vpp)
        elif lay.vpp > 2:
            skipped.append(f"layout.vpp {lay.vpp}: {run.model.n_layers} layers do not split into pp x vpp equal "
                           "stages; torchtitan's default stages per rank are written")
        local = glob // lay.dp
    else:
        local = tr.micro_batch_size
    sections["parallelism"] = par
    sections["training"] = {"local_batch_size": local, "global_batch_size": glob, "seq_len": tr.seq_len,
                            "mixed_precision_param": "bfloat16",
                            "mixed_precision_reduce": "bfloat16" if tr.grad_bytes == 2.0 else "float32"}  # fmt: skip
    sections["activation_checkpoint"] = _ac_section(run, skipped)
    compiled = tr.stack_name in ("torchtitan-compile", "torchtitan-compile-2024")
    sections["compile"] = {"enable": compiled,
                           "components": ["model", "loss"] if tr.stack_name != "torchtitan-compile-2024" else ["model"]}
    if not tr.stack_name.startswith("torchtitan"):
        skipped.append(f"train.stack {tr.stack_name}: read back as torchtitan-{'compile' if compiled else 'eager'}")
    if not isinstance(tr.stack, str):
        skipped.append(f"train.stack overrides {tr.stack.overrides()}: not written (the preset's values are read back)")
    sections["optimizer"] = {"name": "Adam" if tr.optimizer == "adam" else "AdamW"}
    if tr.optimizer == "sgd":
        skipped.append("train.optimizer sgd: written as AdamW")
    lines = [f"# torchtitan job config written by simtrain from run {run.name!r}",
             f"# cluster: {run.hardware.n_nodes} x {run.hardware.node}"]  # fmt: skip
    lines += [f"# not expressible: {s}" for s in skipped]
    for section, values in sections.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n", skipped


def _ac_section(run: RunConfig, skipped: list[str]) -> dict[str, Any]:
    lay = run.layout
    if lay.recompute == "op_sac":
        return {"mode": "selective", "selective_ac_option": "op"}
    if lay.recompute == "full":
        chunk = run.model.n_layers // (lay.pp * lay.vpp)
        if lay.recompute_layers is None or lay.recompute_layers >= chunk:
            return {"mode": "full"}
        if lay.recompute_layers and chunk % lay.recompute_layers == 0:
            return {"mode": "selective", "selective_ac_option": str(chunk // lay.recompute_layers)}
        skipped.append(f"layout.recompute_layers {lay.recompute_layers}: no layer period of {chunk}, written as full")
        return {"mode": "full"}
    if lay.recompute == "selective":
        skipped.append("layout.recompute selective (Megatron modules): torchtitan has none; written as none")
    return {"mode": "none"}
