"""Tests for simtrain.spec.model: parameter counts against published numbers, presets, HF loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from simtrain.spec.errors import ConfigError
from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.model import ModelSpec, list_presets, preset, preset_table

HF_DIR = Path(__file__).parent / "data" / "hf"

# Published totals (parameters). Sources:
# - gpt-*: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
#   Using Megatron-LM" (arXiv 2104.04473), Table 1, "Number of parameters (billion)". Those values
#   are P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) rounded to 0.1B (we add the final LayerNorm, 2h);
#   1.7B and 3.6B are 1.652B and 3.562B before rounding, so the tolerance for them is the rounding.
# - gpt3-175b: Brown et al. 2020 Table 2.1 ("175.0B"); the exact GPT-3 layout gives 174.6B.
# - llama2-*: Touvron et al. 2023 / HF safetensors totals (6.74B, 13.02B, 68.98B).
# - llama3*: HF model cards / safetensors totals of meta-llama/Meta-Llama-3-8B (8.03B),
#   Meta-Llama-3-70B (70.55B), Llama-3.1-405B (405.85B).
PUBLISHED_B: dict[str, float] = {
    "gpt-1.7b": 1.7, "gpt-3.6b": 3.6, "gpt-7.5b": 7.5, "gpt-18b": 18.4, "gpt-39b": 39.1,
    "gpt-76b": 76.1, "gpt-145b": 145.6, "gpt-310b": 310.1, "gpt-530b": 529.6, "gpt-1t": 1008.0,
    "gpt3-175b": 175.0,
    "llama2-7b": 6.74, "llama2-13b": 13.02, "llama2-70b": 68.98,
    "llama3-8b": 8.03, "llama3-70b": 70.55, "llama3.1-8b": 8.03, "llama3.1-70b": 70.55,
    "llama3.1-405b": 405.85,
}  # fmt: skip

# Published values quoted to one decimal with > 0.5 % rounding error at this size.
ROUNDED_TO_0P1 = {"gpt-1.7b", "gpt-3.6b"}

# Exact totals of the HF checkpoints (sum of tensor sizes in model.safetensors, HF model pages):
# Meta-Llama-3-8B 8,030,261,248; Mistral-7B-v0.1 7,241,732,096; Qwen2-7B 7,615,616,512;
# gpt2 124,439,808; pythia-1.4b 1,414,647,808.
HF_EXACT = {
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2-7b": 7_615_616_512,
    "gpt2": 124_439_808,
    "pythia-1.4b": 1_414_647_808,
}


def test_every_preset_has_a_published_count() -> None:
    assert {n for n in list_presets() if not preset(n).is_moe} == set(PUBLISHED_B)  # MoE: test_model_moe.py


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_preset_param_count_matches_published(name: str) -> None:
    published = PUBLISHED_B[name] * 1e9
    got = preset(name).param_count()
    if name in ROUNDED_TO_0P1:
        assert abs(got - published) <= 0.05e9
    else:
        assert abs(got / published - 1) < 0.005, f"{name}: {got / 1e9:.3f}B vs {published / 1e9}B"


@pytest.mark.parametrize("name", [n for n in PUBLISHED_B if n.startswith("gpt-")])
def test_sc21_closed_form(name: str) -> None:
    """Narayanan 2021 appendix: P = 12lh²(1 + 13/(12h) + (V+s)/(12lh)); we add the final LN (2h)."""
    m = preset(name)
    l, h, v, s = m.n_layers, m.hidden, m.vocab, m.max_position  # noqa: E741
    closed = 12 * l * h * h + 13 * l * h + (v + s) * h
    assert m.param_count() == closed + 2 * h


@pytest.mark.parametrize("name", sorted(HF_EXACT))
def test_hf_config_param_count(name: str) -> None:
    m = from_hf_config(HF_DIR / name)
    assert m.param_count() == HF_EXACT[name]


def test_hf_fields_per_family() -> None:
    qwen = from_hf_config(HF_DIR / "qwen2-7b" / "config.json")
    assert qwen.qkv_bias and not qwen.linear_bias and qwen.kv_heads == 4 and qwen.d_head == 128
    gpt2 = from_hf_config(str(HF_DIR / "gpt2"), name="gpt2-small")
    assert gpt2.name == "gpt2-small" and gpt2.tied_embeddings and gpt2.position == "learned"
    assert gpt2.ffn_hidden == 4 * 768 and gpt2.activation == "gelu" and gpt2.linear_bias
    neox = from_hf_config(HF_DIR / "pythia-1.4b")
    assert neox.position == "rope" and not neox.tied_embeddings and neox.norm == "layernorm"
    llama = from_hf_config(HF_DIR / "llama3-8b")
    assert llama.activation == "swiglu" and llama.norm == "rmsnorm"
    assert llama.param_count() == preset("llama3-8b").param_count()


def test_hf_dispatch_on_architectures_and_dict() -> None:
    cfg = json.loads((HF_DIR / "mistral-7b" / "config.json").read_text())
    del cfg["model_type"]
    assert from_hf_config(cfg).param_count() == HF_EXACT["mistral-7b"]


def test_hf_missing_fields_listed_with_paths() -> None:
    cfg = json.loads((HF_DIR / "llama3-8b" / "config.json").read_text())
    del cfg["hidden_size"], cfg["vocab_size"]
    with pytest.raises(ConfigError) as exc:
        from_hf_config(cfg)
    paths = {p.path for p in exc.value.problems}
    assert paths == {"model.hf_config.hidden_size", "model.hf_config.vocab_size"}


def test_hf_missing_file_malformed_and_unsupported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        from_hf_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError):
        from_hf_config(tmp_path)  # directory without config.json
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="JSON"):
        from_hf_config(bad)
    with pytest.raises(ConfigError) as exc:
        from_hf_config({"model_type": "t5"})
    assert exc.value.problems[0].path == "model.hf_config.model_type"


def test_hf_invalid_value_becomes_config_error() -> None:
    cfg = json.loads((HF_DIR / "gpt2" / "config.json").read_text())
    cfg["n_layer"] = 0
    with pytest.raises(ConfigError) as exc:
        from_hf_config(cfg)
    assert exc.value.problems[0].path == "model.n_layers"


def test_gqa_fields() -> None:
    m = preset("llama2-70b")
    assert (m.kv_heads, m.d_head, m.q_dim, m.kv_dim) == (8, 128, 8192, 1024)
    # Megatron theoretical_memory_usage.py: attention = 2h²(1 + g/a) without biases.
    assert m.attention_params() == 2 * 8192**2 * (1 + 8 / 64)
    mha = preset("llama2-7b")
    assert mha.kv_heads == mha.n_heads == 32 and mha.kv_dim == mha.q_dim == 4096


def test_tied_vs_untied_differs_by_vocab_times_hidden() -> None:
    m = preset("llama3-8b")
    tied = m.model_copy(update={"tied_embeddings": True})
    assert m.param_count() - tied.param_count() == m.vocab * m.hidden
    assert tied.lm_head_params() == 0 and m.lm_head_params() == m.vocab * m.hidden


def test_components_add_up() -> None:
    for name in list_presets():
        m = preset(name)
        blocks = sum(m.layer_params(i) for i in range(m.n_layers))
        total = (
            blocks
            + m.final_norm_params()
            + m.embedding_params()
            + m.position_params()
            + m.lm_head_params()
        )
        assert total == m.param_count()
        assert m.non_embedding_params() == blocks + m.final_norm_params()


def test_norm_and_bias_counting() -> None:
    gpt = preset("gpt-1.7b")
    h = gpt.hidden
    assert gpt.norm_params_per_layer() == 4 * h and gpt.final_norm_params() == 2 * h
    assert gpt.mlp_params() == 8 * h * h + 5 * h
    assert gpt.attention_params() == 4 * h * h + 4 * h
    llama = preset("llama3-8b")
    assert llama.norm_params_per_layer() == 2 * llama.hidden and llama.position_params() == 0


_BASE = {
    "name": "x", "n_layers": 2, "hidden": 64, "n_heads": 4, "ffn_hidden": 256, "activation": "gelu",
    "norm": "layernorm", "position": "learned", "vocab": 100, "tied_embeddings": True,
    "linear_bias": True,
}  # fmt: skip


@pytest.mark.parametrize("field", ["n_layers", "hidden", "n_heads", "ffn_hidden", "vocab", "n_kv_heads"])
@pytest.mark.parametrize("value", [0, -1])
def test_rejects_non_positive_sizes(field: str, value: int) -> None:
    with pytest.raises(ValidationError):
        ModelSpec(**{**_BASE, field: value})


def test_rejects_unknown_keys_bad_shapes_and_is_frozen() -> None:
    with pytest.raises(ValidationError):
        ModelSpec(**{**_BASE, "n_experts": 8})
    with pytest.raises(ValidationError):
        ModelSpec(**{**_BASE, "n_kv_heads": 3})  # does not divide 4 heads
    with pytest.raises(ValidationError):
        ModelSpec(**{**_BASE, "n_heads": 5})  # does not divide hidden 64
    m = ModelSpec(**_BASE)
    with pytest.raises(ValidationError):
        m.hidden = 128  # type: ignore[misc]


def test_unknown_preset_lists_names() -> None:
    with pytest.raises(ConfigError) as exc:
        preset("llama9-1b")
    prob = exc.value.problems[0]
    assert prob.path == "model"
    assert all(name in prob.message for name in list_presets())


def test_preset_case_insensitive_aliases_and_table() -> None:
    assert preset("LLaMA3-8B") == preset("llama3-8b")
    assert preset("llama3.1-8b").param_count() == preset("llama3-8b").param_count()
    rows = preset_table()
    assert [r["name"] for r in rows] == list_presets()
    row = next(r for r in rows if r["name"] == "llama3.1-405b")
    assert row["kv_heads"] == 8 and row["ffn"] == 53248 and abs(row["params_B"] - 405.85) < 0.01
