"""What the framework readers share: the import result, the cluster a layout runs on, the final validation.

A framework's launch arguments or job file describe the model, the parallel layout and the batch, never
the cluster (Megatron-LM takes the world size from ``torchrun``, torchtitan from its launcher), so the
hardware comes from a base config or from ``node``/``n_nodes`` options; the data-parallel degree that
fills it is derived.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simtrain.plan.load import load_config
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem, problem


@dataclass(frozen=True, slots=True)
class Imported:
    """A framework config read into a RunConfig, with what was not used.

    ``unknown``: flags or keys simtrain does not know (listed, not fatal). ``ignored``: known ones that do
    not change a training step's time or memory (paths, learning rate, logging, ...). ``notes``:
    approximations made while mapping (each says what was assumed).
    """

    config: RunConfig
    unknown: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def base_data(base: RunConfig | dict[str, Any] | str | Path | None) -> dict[str, Any]:
    """The base config as a plain dict (``{}`` without one); a path is read as YAML/JSON."""
    if base is None:
        return {}
    if isinstance(base, RunConfig):
        return base.model_dump(mode="json")
    if isinstance(base, dict):
        return dict(base)
    return load_config(base).model_dump(mode="json")


def hardware_data(base: dict[str, Any], node: str | None, n_nodes: int | None,
                  gpus_per_node: int | None = None) -> dict[str, Any]:
    """The ``hardware`` section: the base config's, with ``node``/``n_nodes``/``gpus_per_node`` set over it."""
    hw = dict(base.get("hardware") or {})
    if node is not None:
        if hw.get("node") != node:
            hw.pop("gpu", None)  # the base's GPU override belonged to its node
        hw["node"] = node
    if n_nodes is not None:
        if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
            raise ConfigError(problem("--nodes", n_nodes, "a positive number of nodes"))
        hw["n_nodes"] = n_nodes
    if gpus_per_node is not None:
        hw["gpus_per_node"] = gpus_per_node
    return hw


def world_size(hw: dict[str, Any]) -> int:
    """GPUs of the cluster a ``hardware`` section describes."""
    from simtrain.hardware.load import load_node

    per_node = hw.get("gpus_per_node") or load_node(hw.get("node", "dgx-h100"), hw.get("gpu")).gpus_per_node
    return int(per_node) * int(hw.get("n_nodes", 1))


def data_parallel(world: int, model_parallel: int, path: str, detail: str) -> int:
    """World / (product of the model-parallel degrees); ConfigError at ``path`` unless it divides."""
    if model_parallel < 1 or world % model_parallel:
        raise ConfigError(Problem(path, f"{detail} = {model_parallel} does not divide the cluster's {world} GPUs; "
                                        "pick the hardware with --node/--nodes (or a base config) so that it does"))
    return world // model_parallel


#: The layout and train fields a framework config decides; the base config's other fields are kept.
CARRIED = {
    "layout": frozenset({"dp", "tp", "pp", "cp", "ep", "etp", "vpp", "sequence_parallel", "zero_stage", "fsdp",
                         "fsdp_shard_size", "schedule", "recompute", "recompute_modules", "recompute_layers",
                         "offload_activation_layers", "overlap_grad_reduce", "overlap_param_gather",
                         "tp_comm_overlap", "cp_comm", "ep_dispatcher"}),
    "train": frozenset({"seq_len", "micro_batch_size", "global_batch_tokens", "global_batch_seqs", "optimizer",
                        "precision", "fp8_recipe", "grad_dtype", "attention_kernel", "dropout",
                        "moe_capacity_factor", "stack"}),
}  # fmt: skip


def merge(data: dict[str, Any], section: str, values: dict[str, Any]) -> None:
    """Set ``data[section]`` to the base's fields the format does not carry, updated with ``values``."""
    kept = {k: v for k, v in (data.get(section) or {}).items() if k not in CARRIED[section]}
    data[section] = {**kept, **values}


def finish(data: dict[str, Any], unknown: list[str], ignored: list[str], notes: list[str]) -> Imported:
    """Validate the assembled config (every problem with its RunConfig path) and wrap the result.

    A gradient dtype equal to the stack's default and a dropout equal to the model's default (on for GELU
    models) are stored as None, as a hand-written config would leave them.
    """
    run = load_config(data)
    tr = run.train
    update: dict[str, Any] = {}
    if tr.grad_dtype is not None and tr.grad_dtype == tr.stack_spec.grad_dtype:
        update["grad_dtype"] = None
    if tr.dropout is not None and tr.dropout == (run.model.activation == "gelu"):
        update["dropout"] = None
    if update:
        run = run.model_copy(update={"train": tr.model_copy(update=update)})
    return Imported(run, tuple(dict.fromkeys(unknown)), tuple(dict.fromkeys(ignored)), tuple(dict.fromkeys(notes)))


def model_layers(model: Any) -> int | None:
    """Transformer blocks of a model as a config may give it: a preset name, ``{preset: ...}``,
    ``{hf_config: path}``, field dict or ModelSpec (None when it cannot tell)."""
    from simtrain.spec.hf_config import from_hf_config
    from simtrain.spec.model import preset

    if isinstance(model, str):
        return preset(model).n_layers
    if isinstance(model, dict):
        if "hf_config" in model:
            return from_hf_config(model["hf_config"]).n_layers
        if "n_layers" in model:
            return int(model["n_layers"])
        return preset(str(model["preset"])).n_layers if "preset" in model else None
    return getattr(model, "n_layers", None)


def read_text(source: str | Path, what: str) -> tuple[str, str]:
    """(text, stem) of a file; ConfigError naming ``what`` if it cannot be read."""
    p = Path(source)
    if not p.is_file():
        raise ConfigError(problem(what, str(source), "an existing file"))
    try:
        return p.read_text(), p.stem
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(Problem(what, f"cannot read {str(p)!r}: {exc}")) from None
