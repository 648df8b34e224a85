"""Built-in model presets: published architectures as ``ModelSpec`` factories, by name.

Every preset cites the paper table or Hugging Face ``config.json`` its numbers come from. Import
through ``simtrain.spec.model`` (``preset``, ``list_presets``, ``preset_table``), which re-exports these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

from simtrain.spec.errors import ConfigError, problem
from simtrain.spec.model_spec import MLASpec, ModelSpec, MoESpec

__all__ = ["list_presets", "preset", "preset_table"]

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
    table.update(_moe_presets())
    return MappingProxyType(table)


def _moe_presets() -> dict[str, Callable[[], ModelSpec]]:
    """MoE presets; every value is the HF ``config.json`` of the model named in the comment."""
    llama_like: dict[str, Any] = {
        "activation": "swiglu", "norm": "rmsnorm", "position": "rope", "tied_embeddings": False,
        "linear_bias": False,
    }  # fmt: skip
    table: dict[str, Callable[[], ModelSpec]] = {}
    # mistralai/Mixtral-8x7B-v0.1 config.json (Jiang et al. 2024, arXiv 2401.04088, Table 1).
    table["mixtral-8x7b"] = partial(
        ModelSpec, name="mixtral-8x7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
        ffn_hidden=14336, vocab=32000, max_position=32768, **llama_like,
        moe=MoESpec(n_experts=8, top_k=2, ffn_hidden=14336),
    )  # fmt: skip
    # mistral-community/Mixtral-8x22B-v0.1 config.json (Mistral AI, "Cheaper, Better, Faster,
    # Stronger", 2024-04-17).
    table["mixtral-8x22b"] = partial(
        ModelSpec, name="mixtral-8x22b", n_layers=56, hidden=6144, n_heads=48, n_kv_heads=8,
        ffn_hidden=16384, vocab=32000, max_position=65536, **llama_like,
        moe=MoESpec(n_experts=8, top_k=2, ffn_hidden=16384),
    )  # fmt: skip
    # deepseek-ai/DeepSeek-V3 config.json (DeepSeek-V3 report, arXiv 2412.19437, §2 and §4.2):
    # MLA, 1 shared + 256 routed experts top-8, first 3 layers dense, 1 MTP module.
    table["deepseek-v3"] = partial(
        ModelSpec, name="deepseek-v3", n_layers=61, hidden=7168, n_heads=128, n_kv_heads=128,
        ffn_hidden=18432, vocab=129280, max_position=163840, **llama_like,
        mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                    v_head_dim=128),
        moe=MoESpec(n_experts=256, top_k=8, ffn_hidden=2048, n_shared_experts=1, first_k_dense=3,
                    router_bias=True, n_group=8, topk_group=4),
        mtp_depth=1,
    )  # fmt: skip
    # Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json (Qwen3 report, arXiv 2505.09388,
    # Table 2): q/k RMSNorm, head_dim 128, 128 experts top-8, no shared experts, all layers MoE
    # (ffn_hidden is HF intermediate_size, used by no layer).
    table["qwen3-30b-a3b"] = partial(
        ModelSpec, name="qwen3-30b-a3b", n_layers=48, hidden=2048, n_heads=32, n_kv_heads=4,
        head_dim=128, ffn_hidden=6144, vocab=151936, max_position=40960, qk_norm=True, **llama_like,
        moe=MoESpec(n_experts=128, top_k=8, ffn_hidden=768),
    )  # fmt: skip
    table["qwen3-235b-a22b"] = partial(
        ModelSpec, name="qwen3-235b-a22b", n_layers=94, hidden=4096, n_heads=64, n_kv_heads=4,
        head_dim=128, ffn_hidden=12288, vocab=151936, max_position=40960, qk_norm=True, **llama_like,
        moe=MoESpec(n_experts=128, top_k=8, ffn_hidden=1536),
    )  # fmt: skip
    # openai/gpt-oss-120b config.json (gpt-oss model card, arXiv 2508.10925, §2.1): biases on
    # q/k/v/o, attention sinks, head_dim 64, sliding window 128 on even layers, 128 experts top-4
    # with router and expert biases.
    table["gpt-oss-120b"] = partial(
        ModelSpec, name="gpt-oss-120b", n_layers=36, hidden=2880, n_heads=64, n_kv_heads=8,
        head_dim=64, ffn_hidden=2880, vocab=201088, max_position=131072, qkv_bias=True,
        attn_out_bias=True, attn_sinks=True, sliding_window=128, attention_pattern=("sliding", "full"),
        **llama_like,
        moe=MoESpec(n_experts=128, top_k=4, ffn_hidden=2880, router_bias=True, expert_bias=True),
    )  # fmt: skip
    return table


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
    """One row per preset for a CLI listing.

    ``params_B`` is the total count and ``active_params_B`` the per-token active count
    (``active_param_count()``, input embedding included) in billions (1e9); they are equal for
    dense models. ``ffn`` is the expert width for MoE models and the MLP width otherwise;
    ``experts`` is ``"E/k"`` (routed experts / top-k, ``+s`` shared) for MoE and ``""`` for dense.
    """
    rows = []
    for name in _PRESETS:
        m = preset(name)
        experts = ""
        if m.moe is not None:
            shared = f"+{m.moe.n_shared_experts}" if m.moe.n_shared_experts else ""
            experts = f"{m.moe.n_experts}{shared}/{m.moe.top_k}"
        rows.append(
            {
                "name": name, "params_B": round(m.param_count() / 1e9, 3),
                "active_params_B": round(m.active_param_count() / 1e9, 3), "layers": m.n_layers,
                "hidden": m.hidden, "heads": m.n_heads, "kv_heads": m.kv_heads,
                "ffn": m.moe.ffn_hidden if m.moe is not None else m.ffn_hidden, "vocab": m.vocab,
                "experts": experts,
            }
        )  # fmt: skip
    return rows


