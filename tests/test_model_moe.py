"""Tests for the MoE / MLA / MTP / attention-variant parts of simtrain.spec.model and simtrain.lower.flops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from simtrain.lower.flops import (
    attention_keys_per_query,
    layer_forward_flops_per_token,
    model_flops_per_step,
    model_flops_per_token,
)
from simtrain.spec.errors import ConfigError
from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.model import ModelSpec, MoESpec, list_presets, preset, preset_table

HF_DIR = Path(__file__).parent / "data" / "hf"

# Published (total, active) in billions, and whether the publisher's active count includes the
# input embedding (ModelSpec.active_param_count(include_input_embedding=...)). Sources:
# - mixtral-8x7b: Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters but only
#   uses 12.9B parameters per token" (embedding and head both counted: 12.88B).
# - mixtral-8x22b: Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): "39B active
#   parameters out of 141B".
# - deepseek-v3: DeepSeek-V3 README_WEIGHTS.md (deepseek-ai/DeepSeek-V3): main model "Total
#   parameters: 671B", "Activation parameters: 36.6B (including 0.9B for the output Head)", i.e.
#   without the input embedding; the report's abstract rounds it to 37B.
# - qwen3-*: HF model cards Qwen/Qwen3-30B-A3B ("30.5B in total and 3.3B activated") and
#   Qwen/Qwen3-235B-A22B ("235B in total and 22B activated"); Qwen3 report (arXiv 2505.09388).
# - gpt-oss-120b: OpenAI gpt-oss model card (arXiv 2508.10925) Table 1: 116.83B total, 5.13B active
#   (unembedding counted, embedding not: 0.96B attention + 4 of 128 experts + 0.58B unembedding).
PUBLISHED_MOE: dict[str, tuple[float, float, bool]] = {
    "mixtral-8x7b": (46.7, 12.9, True),
    "mixtral-8x22b": (141.0, 39.0, True),
    "deepseek-v3": (671.0, 36.6, False),
    "qwen3-30b-a3b": (30.5, 3.3, True),
    "qwen3-235b-a22b": (235.0, 22.0, True),
    "gpt-oss-120b": (116.83, 5.13, False),
}

# Qwen quotes 3.3B for a count that is 3.353B with both embedding and head (3.04B without the
# embedding): the published figure is the count truncated to 0.1B, so the tolerance there is one
# unit of the quoted digit (1.6 %) instead of 1 %.
ACTIVE_TOLERANCE_B = {"qwen3-30b-a3b": 0.1}

MOE_PRESETS = sorted(PUBLISHED_MOE)

# Exact checkpoint totals (sum of tensor sizes in model.safetensors, HF model pages):
# mistralai/Mixtral-8x7B-v0.1 46,702,792,704; Qwen/Qwen3-8B 8,190,735,360;
# deepseek-ai/DeepSeek-V2-Lite 15,706,484,224.
HF_EXACT = {"mixtral-8x7b": 46_702_792_704, "qwen3-8b": 8_190_735_360, "deepseek-v2-lite": 15_706_484_224}


def test_published_table_covers_every_moe_preset() -> None:
    moe = {n for n in list_presets() if preset(n).is_moe}
    assert moe == set(PUBLISHED_MOE)


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_total_matches_published(name: str) -> None:
    total_b, _, _ = PUBLISHED_MOE[name]
    got = preset(name).param_count() / 1e9
    assert abs(got / total_b - 1) < 0.01, f"{name}: {got:.3f}B vs {total_b}B"


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_active_matches_published(name: str) -> None:
    _, active_b, with_embedding = PUBLISHED_MOE[name]
    got = preset(name).active_param_count(include_input_embedding=with_embedding) / 1e9
    tol = max(0.01 * active_b, ACTIVE_TOLERANCE_B.get(name, 0.0))
    assert abs(got - active_b) <= tol, f"{name}: {got:.3f}B vs {active_b}B"


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_hf_config_equals_preset(name: str) -> None:
    from_hf = from_hf_config(HF_DIR / name)
    p = preset(name)
    assert from_hf.model_dump(exclude={"name"}) == p.model_dump(exclude={"name"})
    assert from_hf.param_count() == p.param_count()
    assert from_hf.active_param_count() == p.active_param_count()


@pytest.mark.parametrize("name", sorted(HF_EXACT))
def test_hf_exact_checkpoint_totals(name: str) -> None:
    assert from_hf_config(HF_DIR / name).param_count() == HF_EXACT[name]


@pytest.mark.parametrize("name", list_presets())
def test_components_add_up_per_layer(name: str) -> None:
    m = preset(name)
    body = sum(m.layer_params(i) for i in range(m.n_layers)) + m.final_norm_params()
    assert m.non_embedding_params() == body
    assert m.param_count() == body + m.embedding_params() + m.position_params() + m.lm_head_params()
    assert m.param_count(include_mtp=True) == m.param_count() + m.mtp_params()


@pytest.mark.parametrize("name", [n for n in list_presets() if not preset(n).is_moe])
def test_dense_active_equals_total(name: str) -> None:
    m = preset(name)
    assert m.active_param_count() == m.param_count() and m.layers_alike and m.mtp_params() == 0
    assert m.layer_active_params() == m.layer_params() and m.moe_layer_indices() == []
    assert m.attention_window(0) is None and m.v_dim == m.kv_dim and m.v_head_dim == m.d_head


def test_mixtral_structure() -> None:
    m = preset("mixtral-8x7b")
    h, f = 4096, 14336
    assert m.expert_params() == 3 * h * f and m.router_params() == 8 * h and m.shared_expert_params() == 0
    assert m.moe_params() == 8 * 3 * h * f + 8 * h
    assert m.moe_active_params() == 2 * 3 * h * f + 8 * h
    assert m.layers_alike and m.layer_params() == m.layer_params(31)
    assert m.moe_layer_indices() == list(range(32)) and m.dense_layer_indices() == []


def test_deepseek_v3_mla_and_layers() -> None:
    m = preset("deepseek-v3")
    h, a = 7168, 128
    # DeepSeek-V3 report §2.1.1 / modeling_deepseek.py: q_a (h×1536) + q_a_layernorm + q_b
    # (1536×a·192) + kv_a_proj_with_mqa (h×(512+64)) + kv_a_layernorm + kv_b (512×a·256) + o (a·128×h).
    mla = h * 1536 + 1536 + 1536 * a * 192 + h * 576 + 512 + 512 * a * 256 + a * 128 * h
    assert m.attention_params() == mla
    assert (m.d_head, m.v_head_dim, m.q_dim, m.kv_dim, m.v_dim) == (192, 128, a * 192, a * 192, a * 128)
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert m.is_moe_layer(61)  # the MTP block (HF model.layers.61) is MoE
    assert m.dense_layer_indices() == [0, 1, 2] and len(m.moe_layer_indices()) == 58
    assert not m.layers_alike
    with pytest.raises(ValueError, match="layer index"):
        m.layer_params()
    # 256 routed + 1 shared expert of width 2048; router weight + e_score_correction_bias.
    assert m.router_params() == 256 * h + 256
    assert m.shared_expert_params() == m.expert_params() == 3 * h * 2048
    assert m.layer_params(0) == mla + 3 * h * 18432 + 2 * h
    assert m.layer_params(3) == mla + 257 * 3 * h * 2048 + 256 * h + 256 + 2 * h


def test_deepseek_v3_mtp_counts() -> None:
    m = preset("deepseek-v3")
    h = m.hidden
    assert m.mtp_depth == 1
    assert m.mtp_params() == m.layer_params(61) + 2 * h * h + 3 * h
    # README_WEIGHTS.md: "11.5B unique parameters (excluding the shared 0.9B Embedding and 0.9B
    # output Head)"; README: 671B main + 14B MTP = 685B on HF, whose MTP layer also stores copies of
    # the embedding and head.
    assert abs(m.mtp_params() / 11.5e9 - 1) < 0.01
    assert abs(m.param_count(include_mtp=True) / 685e9 - 1) < 0.01
    checkpoint = m.param_count(include_mtp=True) + m.embedding_params() + m.lm_head_params()
    assert abs(checkpoint / 685e9 - 1) < 0.001
    assert m.active_param_count(False, include_mtp=True) == m.active_param_count(False) + (
        m.mtp_module_active_params(1)
    )
    with pytest.raises(ValueError):
        m.mtp_module_params(2)


def test_deepseek_v2_lite_without_q_compression() -> None:
    m = from_hf_config(HF_DIR / "deepseek-v2-lite")
    assert m.mla is not None and m.mla.q_lora_rank is None and m.moe is not None
    h, a = 2048, 16
    proj = h * a * 192 + h * 576 + 512 * a * 256 + a * 128 * h
    assert [p[0] for p in m.attention_projections()] == [
        "q_proj",
        "kv_a_proj_with_mqa",
        "kv_b_proj",
        "o_proj",
    ]
    assert m.attention_params() == proj + 512  # kv_a_layernorm only
    assert m.moe.n_shared_experts == 2 and not m.moe.router_bias and m.dense_layer_indices() == [0]
    # DeepSeek-V2 paper (arXiv 2405.04434) appendix B: DeepSeek-V2-Lite has 15.7B total parameters.
    assert abs(m.param_count() / 15.7e9 - 1) < 0.005


def test_qwen3_attention_and_dense_loading() -> None:
    moe = preset("qwen3-30b-a3b")
    d = 128
    attn = 2048 * (32 * d + 2 * 4 * d) + 32 * d * 2048 + 2 * d  # q/k/v/o + q_norm + k_norm
    assert moe.attention_params() == attn and moe.qk_norm and moe.q_dim == 4096 != moe.hidden
    dense = from_hf_config(HF_DIR / "qwen3-8b")
    assert dense.moe is None and dense.qk_norm and dense.d_head == 128 and not dense.qkv_bias
    # Qwen/Qwen3-8B model card: 8.2B parameters, 6.95B non-embedding.
    assert abs(dense.non_embedding_params() / 6.95e9 - 1) < 0.005


def test_qwen3_moe_sparse_step_and_mlp_only_layers() -> None:
    cfg = json.loads((HF_DIR / "qwen3-30b-a3b" / "config.json").read_text())
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[3])
    m = from_hf_config(cfg)
    # modeling_qwen3_moe.py: MoE iff layer not in mlp_only_layers and (layer + 1) % step == 0.
    assert [m.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert m.layer_params(0) == m.attention_params() + m.mlp_params() + m.norm_params_per_layer()
    assert m.mlp_params() == 3 * 2048 * 6144


def test_gpt_oss_structure() -> None:
    m = preset("gpt-oss-120b")
    h, f, a, g, d = 2880, 2880, 64, 8, 64
    # modeling_gpt_oss.py: q/k/v/o with bias, sinks (a); experts gate_up h×2f + 2f, down f×h + h.
    assert m.attention_params() == h * (a * d + 2 * g * d) + a * d * h + (a * d + 2 * g * d) + h + a
    assert m.expert_params() == 3 * h * f + 2 * f + h and m.router_params() == 128 * h + 128
    # gpt-oss model card Table 1: MLP 114.71B, attention 0.96B, embed + unembed 1.16B.
    assert round(36 * m.moe_params() / 1e9, 2) == 114.71
    assert round(36 * m.attention_params() / 1e9, 2) == 0.96
    assert round((m.embedding_params() + m.lm_head_params()) / 1e9, 2) == 1.16
    assert m.attention_pattern == ("sliding", "full") and m.sliding_window == 128
    assert [m.attention_window(i) for i in range(4)] == [128, None, 128, None]


def test_gpt_oss_default_layer_types_and_arch_dispatch() -> None:
    cfg = json.loads((HF_DIR / "gpt-oss-120b" / "config.json").read_text())
    del cfg["layer_types"], cfg["model_type"], cfg["num_experts_per_tok"]
    m = from_hf_config(cfg)
    assert m.attention_pattern == ("sliding", "full") and m.moe is not None and m.moe.top_k == 4


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-8b"])
def test_dispatch_on_architectures(name: str) -> None:
    cfg = json.loads((HF_DIR / name / "config.json").read_text())
    del cfg["model_type"]
    assert from_hf_config(cfg).param_count() == from_hf_config(HF_DIR / name).param_count()


def test_mixtral_sliding_window_config() -> None:
    cfg = json.loads((HF_DIR / "mixtral-8x7b" / "config.json").read_text())
    cfg["sliding_window"] = 4096
    m = from_hf_config(cfg)
    assert m.attention_pattern == ("sliding",) and m.attention_window(5) == 4096


def test_hf_moe_errors_have_paths() -> None:
    cfg = json.loads((HF_DIR / "mixtral-8x7b" / "config.json").read_text())
    del cfg["num_local_experts"]
    with pytest.raises(ConfigError) as exc:
        from_hf_config(cfg)
    assert {p.path for p in exc.value.problems} == {"model.hf_config.num_local_experts"}
    cfg = json.loads((HF_DIR / "gpt-oss-120b" / "config.json").read_text())
    cfg["layer_types"] = cfg["layer_types"][:3]
    with pytest.raises(ConfigError) as exc:
        from_hf_config(cfg)
    assert exc.value.problems[0].path == "model.hf_config.layer_types"
    cfg = json.loads((HF_DIR / "qwen3-30b-a3b" / "config.json").read_text())
    cfg["num_experts_per_tok"] = 512
    with pytest.raises(ConfigError) as exc:
        from_hf_config(cfg)
    assert exc.value.problems[0].path.startswith("model.moe")
    with pytest.raises(ConfigError):
        from_hf_config(
            {**json.loads((HF_DIR / "deepseek-v3" / "config.json").read_text()), "attention_bias": True}
        )


_BASE = {
    "name": "x", "n_layers": 4, "hidden": 64, "n_heads": 4, "ffn_hidden": 256, "activation": "swiglu",
    "norm": "rmsnorm", "position": "rope", "vocab": 100, "tied_embeddings": False, "linear_bias": False,
}  # fmt: skip


def test_validation_of_new_fields() -> None:
    with pytest.raises(ValidationError, match="top_k"):
        MoESpec(n_experts=4, top_k=8, ffn_hidden=16)
    with pytest.raises(ValidationError, match="sliding_window"):
        ModelSpec(**_BASE, attention_pattern=("sliding", "full"))
    with pytest.raises(ValidationError, match="sliding"):
        ModelSpec(**_BASE, sliding_window=16)
    mla = {
        "q_lora_rank": None,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
    }
    with pytest.raises(ValidationError, match="head_dim"):
        ModelSpec(**_BASE, mla=mla, head_dim=16)
    with pytest.raises(ValidationError, match="n_kv_heads"):
        ModelSpec(**_BASE, mla=mla, n_kv_heads=2)
    with pytest.raises(ValidationError):
        ModelSpec(**_BASE, moe={"n_experts": 4, "top_k": 2, "ffn_hidden": 16, "bogus": 1})
    m = ModelSpec(**_BASE, moe={"n_experts": 4, "top_k": 2, "ffn_hidden": 16})
    with pytest.raises(ValueError, match="no MoE"):
        ModelSpec(**_BASE).expert_params()
    assert m.param_count() == m.active_param_count() + 4 * 2 * m.expert_params()


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_specs_roundtrip_through_dump(name: str) -> None:
    m = preset(name)
    assert ModelSpec(**m.model_dump()) == m
    assert ModelSpec.model_validate_json(m.model_dump_json()) == m


def test_preset_table_shows_total_and_active() -> None:
    rows = {r["name"]: r for r in preset_table()}
    ds = rows["deepseek-v3"]
    assert ds["experts"] == "256+1/8" and ds["ffn"] == 2048 and abs(ds["params_B"] - 671.03) < 0.01
    assert abs(ds["active_params_B"] - 37.55) < 0.01  # includes the input embedding
    assert (
        rows["mixtral-8x7b"]["experts"] == "8/2"
        and abs(rows["mixtral-8x7b"]["active_params_B"] - 12.88) < 0.01
    )
    llama = rows["llama3-8b"]
    assert llama["experts"] == "" and llama["active_params_B"] == llama["params_B"]


# ---- model FLOPs ---------------------------------------------------------------------------------


def _dense_flops_reference(model: ModelSpec, seq_len: int) -> float:
    """The dense formula as it stood before MoE support (simtrain/lower/flops.py @dc29204), verbatim."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    n_up = 2 if model.activation == "swiglu" else 1
    gemm_params = h * (q + 2 * kv) + q * h + h * f * n_up + f * h
    attention = 2 * 2 * seq_len * model.d_head * model.n_heads * 0.5
    per_layer = 2 * gemm_params + attention
    head = 2 * h * model.vocab
    return 3.0 * (model.n_layers * per_layer + head)


@pytest.mark.parametrize("name", [n for n in list_presets() if not preset(n).is_moe])
def test_dense_flops_bit_identical(name: str) -> None:
    m = preset(name)
    for s in (1, 7, 2048, 4096, 131072):
        assert model_flops_per_token(m, s) == _dense_flops_reference(m, s)
        assert model_flops_per_token(m, s, include_mtp=False) == _dense_flops_reference(m, s)


def test_mixtral_flops_count_top_k_experts_and_router() -> None:
    m, s = preset("mixtral-8x7b"), 4096
    h, f, q, kv = 4096, 14336, 4096, 1024
    per_layer = 2 * (h * (q + 2 * kv) + q * h + 2 * 3 * h * f + h * 8) + 2 * s * 128 * 32
    assert model_flops_per_token(m, s) == 3.0 * (32 * per_layer + 2 * h * 32000)
    # Active-parameter view: 6 × (active non-embedding GEMM weights) + attention.
    dense_like = m.model_copy(update={"moe": None, "ffn_hidden": 2 * f})
    router = 3 * 2 * 32 * h * 8
    assert model_flops_per_token(m, s) == model_flops_per_token(dense_like, s) + router


def test_deepseek_flops_use_mla_dims_and_mtp_switch() -> None:
    m, s = preset("deepseek-v3"), 4096
    h = m.hidden
    # MLA attention: QK^T over d_h + d_h^R = 192, AV over d_v = 128, causal half.
    attn = 2 * (s / 2) * (192 + 128) * 128
    dense_layer = 2 * (m.attention_gemm_params() + 3 * h * 18432) + attn
    assert layer_forward_flops_per_token(m, 0, s) == dense_layer
    moe_ffn = 256 * h + 9 * 3 * h * 2048  # router + 8 routed + 1 shared
    assert layer_forward_flops_per_token(m, 3, s) == 2 * (m.attention_gemm_params() + moe_ffn) + attn
    mtp = 2 * 2 * h * h + layer_forward_flops_per_token(m, 61, s) + 2 * h * m.vocab
    with_mtp, without = model_flops_per_token(m, s), model_flops_per_token(m, s, include_mtp=False)
    assert with_mtp - without == pytest.approx(3.0 * mtp, rel=1e-12)
    # About 6 × 36.6B active (no input embedding) plus attention: ~220 + ~40 GFLOP per token.
    assert 6 * m.active_param_count(False) < without < 6 * m.active_param_count(False) * 1.2
    assert model_flops_per_step(m, s, 1000) == 1000 * with_mtp


def test_sliding_window_attention_flops() -> None:
    m = preset("gpt-oss-120b")
    s = 4096
    assert attention_keys_per_query(m, 1, s) == s / 2  # full layer
    assert attention_keys_per_query(m, 0, s) == 128 - 128 * 128 / (2 * s)  # window 128
    assert attention_keys_per_query(m, 0, 128) == 64 == attention_keys_per_query(m, 1, 128)  # w = s
    assert attention_keys_per_query(m, 0, 64) == 32  # window longer than the sequence
    full = m.model_copy(update={"sliding_window": None, "attention_pattern": ("full",)})
    diff = model_flops_per_token(full, s) - model_flops_per_token(m, s)
    per_sliding_layer = 2 * (s / 2 - attention_keys_per_query(m, 0, s)) * (64 + 64) * 64
    assert diff == pytest.approx(3.0 * 18 * per_sliding_layer, rel=1e-12)


def test_moe_flops_grow_with_top_k_not_experts() -> None:
    m = preset("qwen3-30b-a3b")
    assert m.moe is not None
    more_experts = m.model_copy(update={"moe": m.moe.model_copy(update={"n_experts": 256})})
    more_k = m.model_copy(update={"moe": m.moe.model_copy(update={"top_k": 16})})
    f0, s = model_flops_per_token(m, 4096), 4096
    # Doubling E adds only the router GEMM (3 × 2 × h × 128 per layer).
    assert model_flops_per_token(more_experts, s) - f0 == 3.0 * 48 * 2 * 2048 * 128
    assert model_flops_per_token(more_k, s) - f0 == 3.0 * 48 * 2 * 8 * 3 * 2048 * 768


def test_routed_expert_split_for_ep() -> None:
    m = preset("deepseek-v3")
    assert m.layer_routed_expert_params(0) == 0
    assert m.layer_routed_expert_params(3) == 256 * m.expert_params()
    assert m.routed_expert_param_count() == 58 * 256 * m.expert_params()
    assert m.routed_expert_param_count(include_mtp=True) == 59 * 256 * m.expert_params()
    assert preset("llama3-8b").routed_expert_param_count() == 0


def test_sliding_window_kernel_visits_every_key_block_its_window_meets() -> None:
    """Hardware work of a 128-key window on 128-key blocks: two key blocks per query block, so twice the
    window's scores (flash-attn local mainloop); model FLOPs keep the window (test above)."""
    from simtrain.lower.blocks import BlockBuilder
    from simtrain.lower.kernels import FLASH_BLOCK

    m, s = preset("gpt-oss-120b"), 4096
    b = BlockBuilder(m, 1, s, 1, False, True, False)
    (windowed,) = b._windowed(False, 128)
    assert windowed.flops == 4.0 * s * (128 + FLASH_BLOCK) * m.n_heads * m.d_head
    (wide,) = b._windowed(False, s - 64)  # a window within a block of the sequence: every key block
    assert wide.flops == 4.0 * s * s * m.n_heads * m.d_head
