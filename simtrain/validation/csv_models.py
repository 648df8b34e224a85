"""A published run's model: a preset by name (loosely matched, with the row's given dimensions checked),
or built from the row's architecture columns (dense or mixture-of-experts, with multi-token prediction);
every mapping is an assumption of the row."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from simtrain.spec.errors import ConfigError, pydantic_problems
from simtrain.spec.model import ModelSpec, list_presets, preset
from simtrain.validation.csv_cells import (
    NotSimulatable,
    count,
    integer,
    text,
)

# Touvron et al. 2023; Llama 3 herd 2024: SwiGLU, RMSNorm, RoPE, untied, no biases. Modern MoE families
# (Mixtral, DBRX, DeepSeek, Qwen-MoE, Kimi) build their blocks the same way (Jiang et al. 2024 Mixtral
# sec. 2; DeepSeek-V3 report sec. 2.1).
_LLAMA_STYLE: Mapping[str, Any] = MappingProxyType(dict(activation="swiglu", norm="rmsnorm", position="rope",
                                                        tied_embeddings=False, linear_bias=False))


def _family(name: str) -> dict[str, Any]:
    """Architecture defaults of a model family named in the ``model`` cell (documented per family)."""
    low = name.lower()
    if "llama" in low or "mistral" in low or "qwen" in low:
        return dict(_LLAMA_STYLE)
    if "mpt" in low:
        # llm-foundry MPT yamls (validation README): GELU 4h, LayerNorm without bias, ALiBi, tied, no biases
        return dict(activation="gelu", norm="layernorm", position="alibi", tied_embeddings=True, linear_bias=False)
    if "bloom" in low:
        # BLOOM paper (BigScience 2022): GELU, LayerNorm, ALiBi, tied embeddings, biases
        return dict(activation="gelu", norm="layernorm", position="alibi", tied_embeddings=True, linear_bias=True)
    if "nemotron" in low:
        # Nemotron-4 report (2024): squared-ReLU MLP (two matrices, costed as GELU), LayerNorm, RoPE, untied
        return dict(activation="gelu", norm="layernorm", position="rope", tied_embeddings=False, linear_bias=False)
    # GPT-2/3 and the Megatron GPT family: GELU, LayerNorm, learned positions, tied, biases
    return dict(activation="gelu", norm="layernorm", position="learned", tied_embeddings=True, linear_bias=True)


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower().replace("llama-", "llama"))


#: The architecture columns a dense model needs (n_kv_heads is optional).
ARCH_COLUMNS = ("n_layers", "hidden", "n_heads", "ffn_hidden", "vocab")


def build_model(row: dict[str, str], seq_len: int, notes: list[str]) -> ModelSpec:
    """The ModelSpec of a row: a preset whose shape matches the architecture columns (their values win
    where they differ), else the columns with the family defaults of the model name."""
    name = row.get("model", "") or "model"
    if text(row, "moe_experts") or text(row, "moe_topk"):
        return _with_mtp(_moe_model(row, name, notes), name, notes)
    dims = {}
    for col in ARCH_COLUMNS:
        value = count(row, col, notes)
        if value is None:
            return _preset_by_name(name, col, _given_dims(row), seq_len, notes)
        dims[col] = value
    kv_text = text(row, "n_kv_heads")
    kv = integer(row, "n_kv_heads", notes) if kv_text and kv_text[0].isdigit() else None
    base = _matching_preset(name, dims, kv)
    fields: dict[str, Any]
    if base is not None:
        fields = base.model_dump()
        changed = [f"{k} {fields[k]}->{v}" for k, v in dims.items() if fields[k] != v]
        notes.append(f"model: preset {base.name}" + (f" with the row's {', '.join(changed)}" if changed else ""))
        fields.update(dims)
    else:
        fam = _family(name)
        notes.append(f"model {name!r}: built from the architecture columns with family defaults "
                     f"({fam['activation']}, {fam['norm']}, {fam['position']} positions, "
                     f"{'tied' if fam['tied_embeddings'] else 'untied'} embeddings"
                     f"{', biases' if fam['linear_bias'] else ''})")
        fields = {"name": name, **dims, **fam}
        if kv is None and not kv_text:
            notes.append("n_kv_heads not given: multi-head attention (= n_heads) assumed")
    fields["n_kv_heads"] = kv if kv is not None else fields.get("n_kv_heads")
    fields["max_position"] = max(int(fields.get("max_position") or 0), seq_len)
    return _model_spec(fields)


def _model_spec(fields: dict[str, Any]) -> ModelSpec:
    """The ModelSpec of a row's fields; a ConfigError naming the ``model.`` field that is invalid."""
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        raise ConfigError(pydantic_problems(exc, "model.")) from None


def _given_dims(row: dict[str, str]) -> dict[str, int]:
    """The architecture columns a row gives (blank or unreadable ones left out)."""
    scratch: list[str] = []
    return {c: v for c in ARCH_COLUMNS if (v := integer(row, c, scratch)) is not None}


def _preset_by_name(name: str, missing: str, given: dict[str, int], seq_len: int, notes: list[str]) -> ModelSpec:
    """The preset the model cell names, for a row without all its architecture columns, when the columns
    it gives agree with it (``missing`` is the first absent one: NotSimulatable when no preset has that
    name, punctuation and case aside, or a given column disagrees)."""
    want = _loose(name)
    for key in list_presets():
        m = preset(key)
        if _loose(key) == want and all(getattr(m, c) == v for c, v in given.items()):
            notes.append(f"model: preset {key} by its name ({missing} and other architecture columns not given)"
                         if given else f"model: preset {key} by its name (architecture columns not given)")
            return m.model_copy(update={"max_position": max(m.max_position or 0, seq_len)})
    raise NotSimulatable(missing, f"architecture column missing and no preset named {name!r} matches the others")


def _matching_preset(name: str, dims: dict[str, int], kv: int | None) -> ModelSpec | None:
    """The preset with the row's layers, hidden and heads (and kv heads when given); the name breaks ties."""
    want = _norm_name(name)
    best: tuple[int, ModelSpec] | None = None
    for key in list_presets():
        m = preset(key)
        if m.moe is not None or (m.n_layers, m.hidden, m.n_heads) != (dims["n_layers"], dims["hidden"], dims["n_heads"]):
            continue
        if kv is not None and m.kv_heads != kv:
            continue
        score = 2 if _norm_name(key) == want else 1 if _norm_name(key) in want or want in _norm_name(key) else 0
        if best is None or score > best[0]:
            best = (score, m)
    return None if best is None else best[1]


def _moe_model(row: dict[str, str], name: str, notes: list[str]) -> ModelSpec:
    """MoE rows: the preset named by the model cell (MoE presets carry routing details the CSV lacks)."""
    want = _norm_name(name)
    for key in list_presets():
        m = preset(key)
        if m.moe is None:
            continue
        k = _norm_name(key)
        if k == want or k in want or want.replace("_", "") in k or _loose(k) == _loose(want):
            notes.append(f"model: MoE preset {key} (routing, shared experts and dense layers from its HF config)")
            return m
    return _moe_from_columns(row, name, notes)


#: The columns a MoE model without a preset is built from (ffn_hidden and n_kv_heads are optional).
MOE_COLUMNS = ("n_layers", "hidden", "n_heads", "vocab", "moe_experts", "moe_topk", "moe_ffn_hidden")


def _moe_from_columns(row: dict[str, str], name: str, notes: list[str]) -> ModelSpec:
    """A MoE model no preset names, from the architecture and MoE columns: every layer MoE, no shared
    experts, Llama-style blocks (each assumption named)."""
    dims: dict[str, int] = {}
    for col in MOE_COLUMNS:
        value = count(row, col, notes)
        if value is None:
            raise NotSimulatable(col, f"no MoE preset matches {name!r} and the {col} column is blank")
        dims[col] = value
    kv = integer(row, "n_kv_heads", notes) if text(row, "n_kv_heads")[:1].isdigit() else None
    ffn = count(row, "ffn_hidden", notes) or dims["moe_ffn_hidden"]
    notes.append(f"model {name!r}: no MoE preset; built from the architecture and MoE columns (every layer MoE, "
                 "no shared experts, SwiGLU experts, RMSNorm, RoPE, untied embeddings, no biases"
                 f"{'' if kv is not None else ', multi-head attention'})")
    fields = dict(name=name, n_layers=dims["n_layers"], hidden=dims["hidden"], n_heads=dims["n_heads"],
                  n_kv_heads=kv, ffn_hidden=ffn, vocab=dims["vocab"], **_LLAMA_STYLE,
                  moe=dict(n_experts=dims["moe_experts"], top_k=dims["moe_topk"], ffn_hidden=dims["moe_ffn_hidden"]))
    return _model_spec(fields)


#: Multi-token prediction named in a model cell (Megatron-Bridge: "DeepSeekV3 (w/o MTP)", "(w/ MTP)").
_NO_MTP = re.compile(r"\b(?:w/o|without|no)\s*mtp\b")


_MTP = re.compile(r"\b(?:w/|with)\s*mtp\b")


def _with_mtp(model: ModelSpec, name: str, notes: list[str]) -> ModelSpec:
    """The model with the MTP depth its cell states: none for "w/o MTP", the preset's (at least 1) for
    "w/ MTP"; unchanged when the cell says nothing."""
    low = name.lower()
    if _NO_MTP.search(low) and model.mtp_depth:
        notes.append(f"model {name!r}: multi-token prediction off (preset depth {model.mtp_depth})")
        return model.model_copy(update={"mtp_depth": 0})
    if _MTP.search(low) and not model.mtp_depth:
        notes.append(f"model {name!r}: one multi-token prediction module (DeepSeek-V3's depth)")
        return model.model_copy(update={"mtp_depth": 1})
    return model


def _loose(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().split("(")[0])
