"""Model specification: a dense decoder-only transformer, its parameter counts, presets, HF loading.

All sizes are element counts (parameters, dimensions), not bytes. Parameter counters follow
Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``,
NVIDIA/Megatron-LM @00caa53): GQA via (1 + g/a), SwiGLU via a third projection, LayerNorm as two
vectors and RMSNorm as one. Unlike that estimator, biases are counted exactly, so the totals match
the published (checkpoint) counts of GPT-2, Llama 2/3, Mistral, Qwen2 and Pythia.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simtrain.errors import ConfigError, Problem, problem

__all__ = [
    "ModelSpec",
    "from_hf_config",
    "list_presets",
    "preset",
    "preset_table",
]


class ModelSpec(BaseModel):
    """A dense decoder-only transformer (GPT / Llama family)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Human-readable name, e.g. ``llama3-8b``."""
    n_layers: int = Field(gt=0)
    """Number of transformer blocks."""
    hidden: int = Field(gt=0)
    """Model (residual stream) width h, elements."""
    n_heads: int = Field(gt=0)
    """Number of query heads a."""
    n_kv_heads: int | None = Field(default=None, gt=0)
    """Number of key/value heads g (GQA); None means g = a (multi-head attention)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width d_h, elements; None means hidden // n_heads."""
    ffn_hidden: int = Field(gt=0)
    """MLP inner width f, elements (per projection for SwiGLU)."""
    activation: Literal["gelu", "swiglu"]
    """MLP activation: GELU (two matrices) or SwiGLU (three matrices: gate, up, down)."""
    norm: Literal["layernorm", "rmsnorm"]
    """Normalisation: LayerNorm (weight + bias) or RMSNorm (weight only)."""
    position: Literal["learned", "rope", "alibi"]
    """Position encoding; only ``learned`` has parameters."""
    vocab: int = Field(gt=0)
    """Vocabulary size V (padded size as used in the embedding table), tokens."""
    max_position: int = Field(default=4096, gt=0)
    """Maximum sequence length, tokens; sizes the learned position table only."""
    tied_embeddings: bool
    """Whether the LM head shares the input embedding matrix."""
    linear_bias: bool
    """GPT-style biases on QKV, attention output and both MLP projections."""
    qkv_bias: bool = False
    """Bias on the QKV projection only (Qwen2); implied by ``linear_bias``."""

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        errors: list[str] = []
        if self.head_dim is None and self.hidden % self.n_heads:
            errors.append(f"n_heads={self.n_heads} does not divide hidden={self.hidden}; set head_dim")
        if self.kv_heads > self.n_heads or self.n_heads % self.kv_heads:
            errors.append(f"n_kv_heads={self.kv_heads} must divide n_heads={self.n_heads}")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    # ---- derived dimensions ------------------------------------------------------------------

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads g (equals n_heads without GQA)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        """Per-head width d_h, elements."""
        return self.hidden // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the query projection output, a·d_h elements."""
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projection outputs, g·d_h elements."""
        return self.kv_heads * self.d_head

    # ---- parameter counters (elements) -------------------------------------------------------

    def attention_params(self) -> int:
        """Parameters of one self-attention block (QKV + output projection, with biases)."""
        # Megatron theoretical_memory_usage.py: 2·h²·(1 + g/a) for Q,K,V,O when a·d_h = h; written
        # here with q_dim/kv_dim so a head_dim ≠ h/a (e.g. Mistral-Nemo) is also exact.
        qkv = self.hidden * (self.q_dim + 2 * self.kv_dim)
        out = self.q_dim * self.hidden
        bias = 0
        if self.linear_bias or self.qkv_bias:  # QKV bias: GPT-2/3 (Radford 2019), Qwen2
            bias += self.q_dim + 2 * self.kv_dim
        if self.linear_bias:  # output-projection bias: GPT only
            bias += self.hidden
        return qkv + out + bias

    def mlp_params(self) -> int:
        """Parameters of one MLP block (GELU: 2·h·f; SwiGLU: 3·h·f; plus biases)."""
        # GELU MLP h→f→h (Vaswani 2017, GPT-2/3); SwiGLU gate+up+down (Shazeer 2020, Llama paper §2.2).
        # Megatron theoretical_memory_usage.py: ×3/2 for gated linear units.
        n_in = 2 if self.activation == "swiglu" else 1
        weights = (n_in + 1) * self.hidden * self.ffn_hidden
        bias = n_in * self.ffn_hidden + self.hidden if self.linear_bias else 0
        return weights + bias

    def _norm_params(self) -> int:
        # LayerNorm: gain + bias (Ba et al. 2016); RMSNorm: gain only (Zhang & Sennrich 2019).
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def norm_params_per_layer(self) -> int:
        """Parameters of the two pre-norms of one block (before attention and before the MLP)."""
        # Megatron theoretical_memory_usage.py: 2 norms per layer, ×2 for LayerNorm.
        return 2 * self._norm_params()

    def layer_params(self) -> int:
        """Parameters of one transformer block."""
        return self.attention_params() + self.mlp_params() + self.norm_params_per_layer()

    def embedding_params(self) -> int:
        """Parameters of the input token embedding, V·h."""
        return self.vocab * self.hidden

    def position_params(self) -> int:
        """Parameters of the learned position table (max_position·h); 0 for RoPE and ALiBi."""
        # GPT-2/3 learned absolute positions; Megatron counts s·h (Narayanan 2021, appendix).
        return self.max_position * self.hidden if self.position == "learned" else 0

    def lm_head_params(self) -> int:
        """Parameters of the output projection, V·h; 0 when tied to the input embedding."""
        # Megatron theoretical_memory_usage.py: the output layer is added when untied.
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def final_norm_params(self) -> int:
        """Parameters of the final norm before the LM head."""
        return self._norm_params()

    def non_embedding_params(self) -> int:
        """Parameters excluding token/position embeddings and the LM head (Kaplan et al. 2020 N)."""
        return self.n_layers * self.layer_params() + self.final_norm_params()

    def param_count(self) -> int:
        """Total number of parameters, everything included."""
        return (
            self.non_embedding_params()
            + self.embedding_params()
            + self.position_params()
            + self.lm_head_params()
        )


# ---- presets -----------------------------------------------------------------------------------


def _gpt(
    name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048
) -> Callable[[], ModelSpec]:
    """GPT-2/3 / Megatron GPT: f = 4h, GELU, LayerNorm, learned positions, tied, biases."""

    def make() -> ModelSpec:
        return ModelSpec(
            name=name, n_layers=layers, hidden=hidden, n_heads=heads, ffn_hidden=4 * hidden,
            activation="gelu", norm="layernorm", position="learned", vocab=vocab,
            max_position=seq, tied_embeddings=True, linear_bias=True,
        )  # fmt: skip

    return make


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, ctx: int
) -> Callable[[], ModelSpec]:
    """Llama: SwiGLU, RMSNorm, RoPE, untied, no biases (Touvron et al. 2023; Llama 3 herd 2024)."""

    def make() -> ModelSpec:
        return ModelSpec(
            name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
            ffn_hidden=ffn, activation="swiglu", norm="rmsnorm", position="rope", vocab=vocab,
            max_position=ctx, tied_embeddings=False, linear_bias=False,
        )  # fmt: skip

    return make


def _build_presets() -> Mapping[str, Callable[[], ModelSpec]]:
    # Megatron GPT weak-scaling family: Narayanan et al. 2021 (arXiv 2104.04473) Table 1 —
    # (name, hidden, heads, layers); vocab 51200, seq 2048.
    sc21 = [
        ("1.7b", 2304, 24, 24), ("3.6b", 3072, 32, 30), ("7.5b", 4096, 32, 36),
        ("18b", 6144, 48, 40), ("39b", 8192, 64, 48), ("76b", 10240, 80, 60),
        ("145b", 12288, 96, 80), ("310b", 16384, 128, 96), ("530b", 20480, 128, 105),
        ("1t", 25600, 160, 128),
    ]  # fmt: skip
    table: dict[str, Callable[[], ModelSpec]] = {
        f"gpt-{size}": _gpt(f"gpt-{size}", layers, h, a) for size, h, a, layers in sc21
    }
    # GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d 12288, 96 heads, ctx 2048; GPT-2 BPE).
    table["gpt3-175b"] = _gpt("gpt3-175b", 96, 12288, 96, vocab=50257, seq=2048)
    # Llama 2: Touvron et al. 2023 + HF config.json (meta-llama/Llama-2-*-hf).
    table["llama2-7b"] = _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096)
    table["llama2-13b"] = _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096)
    table["llama2-70b"] = _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096)
    # Llama 3 / 3.1: "The Llama 3 Herd of Models" Table 3 + HF config.json (meta-llama/*).
    table["llama3-8b"] = _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192)
    table["llama3-70b"] = _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192)
    table["llama3.1-8b"] = _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072)
    table["llama3.1-70b"] = _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072)
    table["llama3.1-405b"] = _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072)
    return MappingProxyType(table)


_PRESETS: Mapping[str, Callable[[], ModelSpec]] = _build_presets()


def list_presets() -> list[str]:
    """Names of the built-in model presets, in definition order."""
    return list(_PRESETS)


def preset(name: str) -> ModelSpec:
    """Return the preset model ``name`` (case-insensitive); ConfigError at ``model`` if unknown."""
    factory = _PRESETS.get(name.strip().lower())
    if factory is None:
        raise ConfigError(problem("model", name, f"known presets: {', '.join(_PRESETS)}"))
    return factory()


def preset_table() -> list[dict[str, Any]]:
    """One row per preset for a CLI listing; ``params_B`` is the total count in billions (1e9)."""
    rows = []
    for name in _PRESETS:
        m = preset(name)
        rows.append(
            {
                "name": name, "params_B": round(m.param_count() / 1e9, 3), "layers": m.n_layers,
                "hidden": m.hidden, "heads": m.n_heads, "kv_heads": m.kv_heads,
                "ffn": m.ffn_hidden, "vocab": m.vocab,
            }
        )  # fmt: skip
    return rows


# ---- Hugging Face config.json ------------------------------------------------------------------

_HF_PATH = "model.hf_config"
_LLAMA_LIKE = ("llama", "mistral", "qwen2")


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
    """Dispatch on ``model_type``, else on ``architectures``; one of llama/mistral/qwen2/gpt2/gpt_neox."""
    known = (*_LLAMA_LIKE, "gpt2", "gpt_neox")
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype in known:
        return mtype
    prefixes = {
        "Llama": "llama",
        "Mistral": "mistral",
        "Qwen2": "qwen2",
        "GPT2": "gpt2",
        "GPTNeoX": "gpt_neox",
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
    return {
        "n_layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg.get("num_key_value_heads"),
        "head_dim": cfg.get("head_dim"), "ffn_hidden": cfg["intermediate_size"],
        "activation": _activation(cfg.get("hidden_act", "silu"), f"{_HF_PATH}.hidden_act"),
        "norm": "rmsnorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 4096),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        # attention_bias sets q/k/v/o biases in HF Llama; with mlp_bias it is GPT-style linear_bias.
        # attention_bias alone maps to qkv_bias (the o_proj bias, h params, is then not counted).
        "linear_bias": attn_bias and mlp_bias,
        # Qwen2Attention hard-codes bias=True on q/k/v_proj (transformers modeling_qwen2.py).
        "qkv_bias": family == "qwen2" or attn_bias,
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
    return {
        "n_layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"], "ffn_hidden": cfg["intermediate_size"],
        "activation": _activation(cfg.get("hidden_act", "gelu"), f"{_HF_PATH}.hidden_act"),
        "norm": "layernorm", "position": "rope", "vocab": cfg["vocab_size"],
        "max_position": cfg.get("max_position_embeddings", 2048),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)), "linear_bias": True,
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

    Supports ``model_type`` llama, mistral, qwen2, gpt2 and gpt_neox (or a matching
    ``architectures`` entry). Every problem is raised as ``ConfigError`` with a ``model.hf_config.*``
    path (missing file, malformed JSON, missing field, unsupported type).
    """
    cfg = dict(source) if isinstance(source, dict) else _read_hf(source)
    family = _family(cfg)
    if family in _LLAMA_LIKE:
        fields = _llama_fields(cfg, family)
    elif family == "gpt2":
        fields = _gpt2_fields(cfg)
    else:
        fields = _neox_fields(cfg)
    try:
        return ModelSpec(name=name or _default_name(cfg, source, family), **fields)
    except ValidationError as exc:
        raise _to_config_error(exc) from exc
