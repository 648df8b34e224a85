"""Hugging Face ``config.json`` to ``ModelSpec``: the field names transformers 4 and 5 write.

``from_hf_config`` reads a config (a path, a directory holding ``config.json`` or a parsed dict) of
one of the supported families and builds the same ``ModelSpec`` a preset would; ``resolve_hf_source``
turns a directory, a file or a model id found in the local Hugging Face cache into a path (no
network). Field names follow the transformers configuration classes cited at each reader
(``configuration_<family>.py``, transformers 4.57 and 5.x). Where transformers 4 and 5 name a field
differently both are read:

- Qwen3-MoE's expert count: ``num_experts`` (transformers 4 ``Qwen3MoeConfig``), ``num_local_experts``
  (transformers 5 ``Qwen3MoeConfig``, the Mixtral name); GPT-OSS's top-k: ``num_experts_per_tok``
  (transformers) or ``experts_per_token`` (OpenAI's original config).
- RoPE: ``rope_theta``/``rope_scaling`` (4) or ``rope_parameters`` (5); neither changes a parameter count.
- ``head_dim`` is written by transformers 5 for Llama/Mistral/Qwen even when it is hidden / heads;
  a ``null`` one (Mixtral in 5) means hidden / heads.

A mixture-of-experts architecture without its expert count is an error naming the field (rather than a
dense model with a fraction of the parameters), and so is an expert count in a config of a dense family.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from simtrain.spec.errors import ConfigError, Problem, problem
from simtrain.spec.model_spec import ModelSpec

__all__ = ["EXPERT_COUNT_FIELDS", "FAMILIES", "from_hf_config", "hf_cache_dirs", "resolve_hf_source"]

_HF_PATH = "model.hf_config"
_LLAMA_LIKE = ("llama", "mistral", "qwen2")
#: Supported ``model_type`` values (transformers model families).
FAMILIES = (*_LLAMA_LIKE, "gpt2", "gpt_neox", "mixtral", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
            "gpt_oss")  # fmt: skip
_FAMILIES = FAMILIES
_MOE_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
#: Routed-expert count field names: ``num_local_experts`` (MixtralConfig, GptOssConfig, transformers 5
#: Qwen3MoeConfig), ``num_experts`` (transformers 4 Qwen3MoeConfig), ``n_routed_experts``
#: (DeepseekV2Config/DeepseekV3Config).
EXPERT_COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
#: Top-k field names: ``num_experts_per_tok`` (transformers), ``experts_per_token`` (OpenAI gpt-oss).
_TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token")


def _read_hf(source: str | Path) -> dict[str, Any]:
    """Read ``config.json`` from a file or a directory containing one."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(problem(_HF_PATH, str(path), "expected an existing config.json file"))
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(Problem(_HF_PATH, f"cannot read {path} as JSON: {exc}")) from exc
    if not isinstance(data, dict):
        raise ConfigError(problem(_HF_PATH, type(data).__name__, "expected a JSON object"))
    return data


def _family(cfg: Mapping[str, Any]) -> str:
    """Dispatch on ``model_type``, else on ``architectures``; one of ``_FAMILIES``."""
    known = _FAMILIES
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype in known:
        return mtype
    prefixes = {
        "Llama": "llama",
        "Mistral": "mistral",
        "Qwen2": "qwen2",
        "GPT2": "gpt2",
        "GPTNeoX": "gpt_neox",
        "Mixtral": "mixtral",
        "Qwen3": "qwen3",
        "Qwen3Moe": "qwen3_moe",
        "DeepseekV2": "deepseek_v2",
        "DeepseekV3": "deepseek_v3",
        "GptOss": "gpt_oss",
    }
    for arch in cfg.get("architectures") or []:
        for prefix, fam in prefixes.items():
            if str(arch).startswith(prefix) and not str(arch).startswith(prefix + "Moe"):
                return fam
    raise ConfigError(
        problem(f"{_HF_PATH}.model_type", cfg.get("model_type"), f"supported model types: {', '.join(known)}")
    )


def _require(cfg: Mapping[str, Any], keys: list[str]) -> None:
    missing = [Problem(f"{_HF_PATH}.{k}", "required field is missing") for k in keys if cfg.get(k) is None]
    if missing:
        raise ConfigError(missing)


def _expert_count(
    cfg: Mapping[str, Any], family: str, keys: tuple[str, ...] = EXPERT_COUNT_FIELDS[:2]
) -> int:
    """The routed-expert count of an MoE config under one of ``keys``; ConfigError naming them if absent."""
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(problem(f"{_HF_PATH}.{key}", value, "a positive number of routed experts"))
            return value
    names = " or ".join(keys)
    raise ConfigError(Problem(f"{_HF_PATH}.{keys[0]}",
                              f"model_type {family!r} is a mixture-of-experts architecture but the config has no "
                              f"expert count ({names}); without it the model would load as dense"))  # fmt: skip


def _top_k(cfg: Mapping[str, Any]) -> Any:
    """Experts per token under either name; ConfigError naming ``num_experts_per_tok`` if absent."""
    for key in _TOP_K_FIELDS:
        if cfg.get(key) is not None:
            return cfg[key]
    raise ConfigError(
        Problem(f"{_HF_PATH}.num_experts_per_tok", "required field is missing (experts per token)")
    )


def _check_dense(cfg: Mapping[str, Any], family: str) -> None:
    """A dense family's config holding an expert count is a mislabelled MoE config: refuse it."""
    for key in EXPERT_COUNT_FIELDS:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise ConfigError(problem(f"{_HF_PATH}.model_type", cfg.get("model_type", family),
                                      f"{key}={value} says mixture-of-experts, but {family!r} is a dense family; "
                                      f"use the MoE model_type ({', '.join(_MOE_FAMILIES)})"))  # fmt: skip


def _activation(act: Any, path: str) -> Literal["gelu", "swiglu"]:
    act = str(act).lower()
    if act in ("silu", "swish"):
        return "swiglu"  # Llama-family gated MLP: act_fn(gate(x)) * up(x)
    if act.startswith("gelu"):
        return "gelu"
    raise ConfigError(problem(path, act, "supported: silu/swish (SwiGLU) or gelu*"))


def _llama_fields(cfg: Mapping[str, Any], family: str) -> dict[str, Any]:
    """Llama / Mistral / Qwen2 (transformers ``LlamaConfig`` and friends)."""
    _require(
        cfg, ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"]
    )
    attn_bias = bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    # Qwen2Config: sliding window only with use_sliding_window, on layers >= max_window_layers (4), or as
    # layer_types names them (5). Llama/Mistral keep full attention here as before (Mistral's
    # sliding_window of 4096 equals its trained context).
    window = (
        _attention_fields(cfg, cfg["num_hidden_layers"], window_everywhere=False) if family == "qwen2" else {}
    )
    return {
        **window,
        "n_layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg.get("num_key_value_heads"),
        "head_dim": cfg.get("head_dim"), "ffn_hidden": cfg["intermediate_size"],
        "activation": _activation(cfg.get("hidden_act", "silu"), f"{_HF_PATH}.hidden_act"),
        "norm": "rmsnorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 4096),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        # attention_bias sets q/k/v/o biases in HF Llama; with mlp_bias it is GPT-style linear_bias.
        "linear_bias": attn_bias and mlp_bias,
        # Qwen2Attention hard-codes bias=True on q/k/v_proj (transformers modeling_qwen2.py).
        "qkv_bias": family == "qwen2" or attn_bias,
        "attn_out_bias": attn_bias,  # LlamaAttention o_proj bias=config.attention_bias
    }  # fmt: skip


def _gpt2_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-2 (transformers ``GPT2Config``): tied, biases, LayerNorm, learned positions."""
    _require(cfg, ["n_embd", "n_layer", "n_head", "vocab_size"])
    hidden = cfg["n_embd"]
    return {
        "n_layers": cfg["n_layer"], "hidden": hidden, "n_heads": cfg["n_head"],
        "ffn_hidden": cfg.get("n_inner") or 4 * hidden,
        "activation": _activation(cfg.get("activation_function", "gelu_new"), f"{_HF_PATH}.activation_function"),
        "norm": "layernorm", "position": "learned", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("n_positions", 1024),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)), "linear_bias": True,
    }  # fmt: skip


def _neox_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-NeoX / Pythia (transformers ``GPTNeoXConfig``): LayerNorm, GELU, rotary, biases, untied.

    ``rotary_pct`` (partial rotary) and ``use_parallel_residual`` change no parameter count: both
    layouts keep two LayerNorms per block.
    """
    _require(
        cfg, ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"]
    )
    if cfg.get("attention_bias") is False:  # GPTNeoXConfig.attention_bias (default True); MLP biases stay
        raise ConfigError(problem(f"{_HF_PATH}.attention_bias", False,
                                  "GPT-NeoX without attention biases is not modelled (true)"))  # fmt: skip
    return {
        "n_layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"], "ffn_hidden": cfg["intermediate_size"],
        "activation": _activation(cfg.get("hidden_act", "gelu"), f"{_HF_PATH}.hidden_act"),
        "norm": "layernorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 2048),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)), "linear_bias": True,
    }  # fmt: skip


def _attention_fields(cfg: Mapping[str, Any], n_layers: int, window_everywhere: bool) -> dict[str, Any]:
    """``sliding_window`` and ``attention_pattern`` from HF ``layer_types``/``sliding_window``.

    ``layer_types`` (GPT-OSS, newer Qwen3/Mixtral configs) names each layer's attention; without it
    a Qwen config slides on layers ``>= max_window_layers`` when ``use_sliding_window`` (HF
    configuration_qwen3.py), and a Mixtral one on every layer when ``sliding_window`` is set
    (``window_everywhere``; modeling_mixtral.py). The per-layer list is stored as its shortest period.
    """
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ConfigError(
                problem(f"{_HF_PATH}.layer_types", types, f"expected a list of {n_layers} entries")
            )
        kinds = ["sliding" if "sliding" in str(t) else "full" for t in types]
    elif window is not None and window_everywhere:
        kinds = ["sliding"] * n_layers
    elif window is not None and cfg.get("use_sliding_window"):
        first = int(cfg.get("max_window_layers", n_layers))
        kinds = ["sliding" if i >= first else "full" for i in range(n_layers)]
    else:
        kinds = ["full"]
    if "sliding" not in kinds:
        return {"sliding_window": None, "attention_pattern": ("full",)}
    if window is None:
        raise ConfigError(Problem(f"{_HF_PATH}.sliding_window", "required field is missing"))
    period = next(p for p in range(1, len(kinds) + 1) if all(k == kinds[i % p] for i, k in enumerate(kinds)))
    return {"sliding_window": window, "attention_pattern": tuple(kinds[:period])}


def _mixtral_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Mixtral (transformers ``MixtralConfig``): Mistral attention, every MLP an 8-expert top-2 MoE."""
    n_experts, top_k = _expert_count(cfg, "mixtral"), _top_k(cfg)
    fields = _llama_fields(cfg, "mixtral")
    # modeling_mixtral.py MixtralSparseMoeBlock: gate Linear(h, E, bias=False); experts of width
    # intermediate_size, no biases.
    moe = dict(n_experts=n_experts, top_k=top_k, ffn_hidden=cfg["intermediate_size"])
    return {**fields, **_attention_fields(cfg, fields["n_layers"], window_everywhere=True), "moe": moe}


def _qwen3_fields(cfg: Mapping[str, Any], family: str) -> dict[str, Any]:
    """Qwen3 dense and Qwen3-MoE (transformers ``Qwen3Config``/``Qwen3MoeConfig``).

    Attention: q/k/v/o biases only with ``attention_bias`` (default False), q_norm/k_norm RMSNorm
    over head_dim (modeling_qwen3.py). MoE: layer i is MoE iff i is not in
    ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` == 0 (modeling_qwen3_moe.py
    Qwen3MoeDecoderLayer); the others are dense MLPs of width ``intermediate_size``.
    """
    _require(
        cfg, ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"]
    )
    attn_bias = bool(cfg.get("attention_bias", False))
    n_layers = cfg["num_hidden_layers"]
    # Qwen3Config declares head_dim = 128; Qwen3MoeConfig declares none, and modeling_qwen3_moe.py falls
    # back to hidden_size // num_attention_heads (getattr(config, "head_dim", ...)).
    head_dim = cfg.get("head_dim", 128 if family == "qwen3" else None)
    fields: dict[str, Any] = {
        "n_layers": n_layers, "hidden": cfg["hidden_size"], "n_heads": cfg["num_attention_heads"],
        "n_kv_heads": cfg.get("num_key_value_heads"), "head_dim": head_dim,
        "ffn_hidden": cfg["intermediate_size"],
        "activation": _activation(cfg.get("hidden_act", "silu"), f"{_HF_PATH}.hidden_act"),
        "norm": "rmsnorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 32768),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)), "linear_bias": False,
        "qkv_bias": attn_bias, "attn_out_bias": attn_bias, "qk_norm": True,
        **_attention_fields(cfg, n_layers, window_everywhere=False),
    }  # fmt: skip
    if family == "qwen3_moe":
        # transformers 4 Qwen3MoeConfig: num_experts; transformers 5: num_local_experts.
        n_experts, top_k = _expert_count(cfg, family), _top_k(cfg)
        _require(cfg, ["moe_intermediate_size"])
        step = int(cfg.get("decoder_sparse_step") or 1)
        only = {int(i) for i in cfg.get("mlp_only_layers") or []}
        dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
        fields["moe"] = dict(
            n_experts=n_experts, top_k=top_k,
            ffn_hidden=cfg["moe_intermediate_size"], dense_layers=dense,
        )  # fmt: skip
    return fields


def _deepseek_fields(cfg: Mapping[str, Any], family: str) -> dict[str, Any]:
    """DeepSeek-V2/V3 (``modeling_deepseek.py``; transformers ``DeepseekV3Config``): MLA + DeepSeekMoE + MTP.

    Layer i is MoE iff ``n_routed_experts`` is set, i >= ``first_k_dense_replace`` and
    i % ``moe_layer_freq`` == 0; the shared experts form one MLP of width
    ``n_shared_experts × moe_intermediate_size``. The router's ``e_score_correction_bias`` exists for
    ``topk_method == "noaux_tc"`` (every V3 checkpoint).
    """
    _require(cfg, ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                   "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"])  # fmt: skip
    if cfg.get("attention_bias"):
        raise ConfigError(
            problem(f"{_HF_PATH}.attention_bias", True, "MLA with attention biases is not modelled")
        )
    mla = dict(
        q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=cfg["kv_lora_rank"],
        qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
        v_head_dim=cfg["v_head_dim"],
    )  # fmt: skip
    fields: dict[str, Any] = {
        "n_layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg.get("num_key_value_heads"),
        "ffn_hidden": cfg["intermediate_size"],
        "activation": _activation(cfg.get("hidden_act", "silu"), f"{_HF_PATH}.hidden_act"),
        "norm": "rmsnorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 4096),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)), "linear_bias": False,
        "mla": mla, "mtp_depth": int(cfg.get("num_nextn_predict_layers") or 0),
    }  # fmt: skip
    # modeling_deepseek.py: an explicit n_routed_experts of null makes every MLP dense; a config without the
    # field is a truncated MoE config.
    if "n_routed_experts" not in cfg:
        _expert_count(cfg, family, ("n_routed_experts",))
    if cfg.get("n_routed_experts"):
        _require(cfg, ["moe_intermediate_size"])
        fields["moe"] = dict(
            n_experts=_expert_count(cfg, family, ("n_routed_experts",)), top_k=_top_k(cfg),
            ffn_hidden=cfg["moe_intermediate_size"], n_shared_experts=cfg.get("n_shared_experts") or 0,
            first_k_dense=cfg.get("first_k_dense_replace") or 0, layer_freq=cfg.get("moe_layer_freq") or 1,
            router_bias=family == "deepseek_v3" or cfg.get("topk_method") == "noaux_tc",
            n_group=cfg.get("n_group") or 1, topk_group=cfg.get("topk_group") or 1,
        )  # fmt: skip
    return fields


def _gpt_oss_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-OSS (transformers ``GptOssConfig``, modeling_gpt_oss.py).

    Attention: q/k/v/o with ``attention_bias`` (default True), per-head sinks, head_dim, sliding
    window on the layers ``layer_types`` names (default: even layers). MoE on every layer: router
    weight + bias, experts with gate_up/down biases, width ``intermediate_size``.
    """
    _require(
        cfg, ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"]
    )
    n_experts, top_k = _expert_count(cfg, "gpt_oss"), _top_k(cfg)
    n_layers = cfg["num_hidden_layers"]
    attn_bias = bool(cfg.get("attention_bias", True))
    layer_cfg = dict(cfg)
    if layer_cfg.get("layer_types") is None:  # GptOssConfig default: sliding on even layers
        layer_cfg["layer_types"] = [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)
        ]
    layer_cfg.setdefault("sliding_window", 128)
    return {
        "n_layers": n_layers, "hidden": cfg["hidden_size"], "n_heads": cfg["num_attention_heads"],
        "n_kv_heads": cfg.get("num_key_value_heads"), "head_dim": cfg.get("head_dim", 64),
        "ffn_hidden": cfg["intermediate_size"], "activation": "swiglu",  # clamped SwiGLU, 3 matrices
        "norm": "rmsnorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 131072),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)), "linear_bias": False,
        "qkv_bias": attn_bias, "attn_out_bias": attn_bias, "attn_sinks": True,
        **_attention_fields(layer_cfg, n_layers, window_everywhere=False),
        "moe": dict(n_experts=n_experts, top_k=top_k, ffn_hidden=cfg["intermediate_size"],
                       router_bias=True, expert_bias=True),
    }  # fmt: skip


def _default_name(cfg: Mapping[str, Any], source: str | Path | dict[str, Any], family: str) -> str:
    if cfg.get("_name_or_path"):
        return str(cfg["_name_or_path"])
    if not isinstance(source, dict):
        path = Path(source)
        return (path if path.is_dir() or path.name != "config.json" else path.parent).name or family
    return family


def _to_config_error(exc: ValidationError) -> ConfigError:
    probs = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        probs.append(Problem(f"model.{loc}" if loc else "model", f"{err['msg']} (from {_HF_PATH})"))
    return ConfigError(probs)


def from_hf_config(source: str | Path | dict[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (path, directory, or parsed dict).

    Supports ``model_type`` llama, mistral, qwen2, gpt2, gpt_neox, mixtral, qwen3, qwen3_moe,
    deepseek_v2, deepseek_v3 and gpt_oss (or a matching ``architectures`` entry). Every problem is
    raised as ``ConfigError`` with a ``model.hf_config.*`` path (missing file, malformed JSON,
    missing field, unsupported type).
    """
    cfg = dict(source) if isinstance(source, dict) else _read_hf(source)
    family = _family(cfg)
    if family not in _MOE_FAMILIES:
        _check_dense(cfg, family)
    try:
        fields = _family_fields(cfg, family)
        return ModelSpec(name=name or _default_name(cfg, source, family), **fields)
    except ValidationError as exc:
        raise _to_config_error(exc) from exc


def _family_fields(cfg: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The ModelSpec fields of a config of ``family`` (raises ConfigError or ValidationError)."""
    if family in _LLAMA_LIKE:
        return _llama_fields(cfg, family)
    if family == "gpt2":
        return _gpt2_fields(cfg)
    if family == "gpt_neox":
        return _neox_fields(cfg)
    if family == "mixtral":
        return _mixtral_fields(cfg)
    if family in ("qwen3", "qwen3_moe"):
        return _qwen3_fields(cfg, family)
    if family in ("deepseek_v2", "deepseek_v3"):
        return _deepseek_fields(cfg, family)
    return _gpt_oss_fields(cfg)


# ---- where a config comes from: a directory, a file, or a model id in the local cache --------------


def hf_cache_dirs() -> list[Path]:
    """Hub cache folders searched for a model id, in order (huggingface_hub ``constants.py``).

    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub``; also the legacy ``$TRANSFORMERS_CACHE`` when set.
    """
    env = os.environ
    dirs: list[Path] = []
    if env.get("HF_HUB_CACHE"):
        dirs.append(Path(env["HF_HUB_CACHE"]))
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]) / "hub")
    xdg = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    dirs.append(xdg / "huggingface" / "hub")
    if env.get("TRANSFORMERS_CACHE"):
        dirs.append(Path(env["TRANSFORMERS_CACHE"]))
    return list(dict.fromkeys(d.expanduser() for d in dirs))


def _cached_config(model_id: str, cache: Path) -> Path | None:
    """``config.json`` of ``model_id`` in one hub cache: the snapshot ``refs/main`` names, else the newest."""
    repo = cache / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip() / "config.json"
        if pinned.is_file():
            return pinned
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: (p.stat().st_mtime, p.parent.name))
    return found[-1] if found else None


def resolve_hf_source(text: str | Path, path: str = "--hf-config") -> Path:
    """The ``config.json`` (or its directory) that ``text`` names: a path, or a model id (``org/name``)
    found in the local Hugging Face hub cache (``hf_cache_dirs``); nothing is downloaded.

    Raises:
        ConfigError: at ``path``, naming the value and the places searched.
    """
    given = Path(text).expanduser()
    if given.is_file() or (given.is_dir() and (given / "config.json").is_file()):
        return given
    name = str(text).strip()
    parts = name.split("/")
    caches = hf_cache_dirs()
    if len(parts) == 2 and all(parts) and not given.exists():
        for cache in caches:
            found = _cached_config(name, cache)
            if found is not None:
                return found
    where = ", ".join(str(c) for c in caches)
    raise ConfigError(
        problem(
            path,
            str(text),
            "a directory holding config.json, a config.json file, or a model "
            f"id (org/name) already in the local Hugging Face cache (searched {where})",
        )
    )
