"""JSON Schema of a run config (``simtrain schema``), for editors that complete and check YAML files.

The schema is pydantic's (``RunConfig.model_json_schema()``, JSON Schema draft 2020-12): every field with
its type, bounds, default and description (the field's docstring, units included). What pydantic
cannot see is added: ``model`` also takes a preset name, ``{preset: ..., overrides}`` or
``{hf_config: path}`` (``RunConfig._resolve_model``), and the counts that accept "4M"/"1.4T" strings
(fields with a ``mode="before"`` count validator) also take such a string. Fields of the ``run``
section (``simtrain.spec.batch``, whose models do not set ``use_attribute_docstrings``) get their docstrings
read from the source, or the descriptions in ``_FALLBACK`` where they have none. ``train.stack`` takes a
preset name or a ``StackOverride`` whose fields may also be given by their flat names
(``simtrain.spec.stacks``); the stack groups' fields carry no default there (an unset field is the preset's).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from pydantic import BaseModel

from simtrain.spec.config import RunConfig
from simtrain.spec.stacks import DEFAULT_STACK, FLAT_FIELDS, STACKS, SoftwareStack, StackOverride

__all__ = ["COUNT_PATTERN", "run_config_schema"]

#: A token or sequence count as ``simtrain.spec.batch.parse_count`` reads it: a number with an optional decimal
#: (K, M, G, B, T) or binary (Ki, Mi, Gi, Ti) suffix.
COUNT_PATTERN = r"^\s*[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?\s*([KMGBTkmgbt]i?)?\s*$"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

_FALLBACK = {
    ("RunSpec", "currency"): "Currency of ``price_per_gpu_hour`` (a label, e.g. USD).",
    ("RunSpec", "batch_schedule"): "How the global batch changes over the run (default: constant, ``train``'s).",
    ("BatchSchedule", "kind"): "constant (train's batch), step (one step up), linear (Megatron's "
                               "rampup-batch-size) or table (explicit phases).",
    ("TablePhase", "global_batch_tokens"): "Global batch of this phase, tokens (or give global_batch_seqs).",
    ("TablePhase", "global_batch_seqs"): "Global batch of this phase, sequences.",
}  # fmt: skip


def _models(cls: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from ``cls`` through its fields, by class name."""
    found: dict[str, type[BaseModel]] = {}
    todo = [cls]
    while todo:
        c = todo.pop()
        if c.__name__ in found:
            continue
        found[c.__name__] = c
        for field in c.model_fields.values():
            stack = [field.annotation]
            while stack:
                t = stack.pop()
                if isinstance(t, type) and issubclass(t, BaseModel):
                    todo.append(t)
                stack += list(getattr(t, "__args__", ()))
    return found


def _docstrings(cls: type[BaseModel]) -> dict[str, str]:
    """``{field: docstring}`` of the attribute docstrings in ``cls``'s source (empty if unavailable)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return out


def _count_fields(cls: type[BaseModel]) -> set[str]:
    """Numeric fields of ``cls`` that a ``mode="before"`` validator lets take a count string."""
    out: set[str] = set()
    for dec in cls.__pydantic_decorators__.field_validators.values():
        if dec.info.mode == "before":
            out.update(f for f in dec.info.fields if f not in ("model", "stack"))
    return out


def _allow_string(prop: dict[str, Any]) -> dict[str, Any]:
    count = {"type": "string", "pattern": COUNT_PATTERN}
    if "anyOf" in prop:
        return {**prop, "anyOf": [*prop["anyOf"], count]}
    kept = {k: v for k, v in prop.items() if k in ("description", "default", "title")}
    rule = {k: v for k, v in prop.items() if k not in kept}
    return {**kept, "anyOf": [rule, count]}


def _model_property(described: dict[str, Any]) -> dict[str, Any]:
    from simtrain.spec.model import list_presets

    presets = list_presets()
    return {
        "description": described.get("description", ""),
        "anyOf": [
            {"type": "string", "enum": presets, "description": "A model preset (simtrain models)."},
            {"type": "object", "required": ["preset"],
             "properties": {"preset": {"type": "string", "enum": presets, "description": "The preset."}},
             "description": "A preset with some ModelSpec fields overridden."},
            {"type": "object", "required": ["hf_config"], "additionalProperties": False,
             "properties": {"hf_config": {"type": "string", "description": "A Hugging Face config.json or its "
                                          "folder (relative to the config file)."},
                            "name": {"type": "string", "description": "The model's name (default: the config's)."}},
             "description": "The model of a Hugging Face config.json."},
            {"$ref": "#/$defs/ModelSpec"},
        ],
    }  # fmt: skip


def _stack_property(described: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``train.stack``: a preset name, or a StackOverride whose fields also go by their flat names."""
    override = defs["StackOverride"]
    override["properties"]["preset"]["enum"] = list(STACKS)
    for flat, (group, field) in FLAT_FIELDS.items():
        if group not in StackOverride.model_fields:  # a row default: the run config states it itself
            continue
        spec = defs[SoftwareStack.model_fields[group].default.__class__.__name__]["properties"][field]
        override["properties"][flat] = {**spec, "description": f"``{group}.{field}``: {spec.get('description', '')}"}
    return {
        "description": described.get("description", ""),
        "default": DEFAULT_STACK,
        "anyOf": [{"type": "string", "enum": list(STACKS), "description": "A software stack preset."},
                  {"$ref": "#/$defs/StackOverride"}],
    }


def _stack_groups(defs: dict[str, Any]) -> None:
    """Drop the class defaults of the stack groups' fields: an unset field keeps the preset's value."""
    for group in StackOverride.model_fields:
        if group == "preset":
            continue
        name = SoftwareStack.model_fields[group].default.__class__.__name__
        for prop in defs.get(name, {}).get("properties", {}).values():
            prop.pop("default", None)
    for prop in defs.get("OpFusion", {}).get("properties", {}).values():
        prop.pop("default", None)


def run_config_schema() -> dict[str, Any]:
    """The JSON Schema of a run config file (a dict ready for ``json.dumps``)."""
    schema = RunConfig.model_json_schema(mode="validation")
    defs = schema.setdefault("$defs", {})
    classes = _models(RunConfig)
    for name, cls in classes.items():
        node = schema if cls is RunConfig else defs.get(name)
        if node is None:
            continue
        props = node.get("properties", {})
        # the stack's before-validators refuse booleans and resolve presets; they take no count strings
        for field in _count_fields(cls) if cls.__module__ not in ("simtrain.spec.stack_spec", "simtrain.spec.stacks") else ():
            if field in props:
                props[field] = _allow_string(props[field])
        docs: dict[str, str] | None = None
        for field, prop in props.items():
            if "description" in prop:
                continue
            docs = _docstrings(cls) if docs is None else docs
            text = docs.get(field) or _FALLBACK.get((name, field))
            if text:
                prop["description"] = text
    schema["properties"]["model"] = _model_property(schema["properties"]["model"])
    _stack_groups(defs)
    train = defs["TrainConfig"]["properties"]
    train["stack"] = _stack_property(train["stack"], defs)
    return {"$schema": DRAFT, "title": "simtrain run config", **{k: v for k, v in schema.items() if k != "title"}}
