"""simtrain's parameter count of a Hugging Face config equals transformers' own model on the meta device.

Each case builds the family's configuration class in transformers (the dims of a published model, or
small variants that switch on a feature), writes ``config.json`` with ``to_json_file`` (the file a
user has), loads it with ``simtrain.spec.hf_config.from_hf_config`` and compares ``param_count()`` with
the parameters of ``AutoModelForCausalLM.from_config`` built under ``torch.device("meta")`` (no
memory). The same file is then rewritten with the field names transformers 4 used, which must load
to the same model. Skipped when transformers or torch is not importable (CI installs both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simtrain.spec.errors import ConfigError
from simtrain.spec.hf_config import from_hf_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# model_type -> (config kwargs). Dims are the published models' config.json values (Llama-3.1-8B,
# Mistral-7B, Qwen2-7B, Qwen3-8B, Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V2-Lite, DeepSeek-V3,
# gpt-oss-120b, GPT-2, Pythia-1.4B) or small variants switching on one feature each.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                  max_position_embeddings=131072)),
    "llama-biases-tied": ("llama", dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=2, vocab_size=3200,
                                        attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    "mistral-7b": ("mistral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)),
    "mistral-nemo-head-dim": ("mistral", dict(hidden_size=5120, intermediate_size=14336, num_hidden_layers=4,
                                              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                              vocab_size=131072)),
    "qwen2-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=151936)),
    "qwen3-0.6b-tied": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                      num_attention_heads=16, num_key_value_heads=8, vocab_size=151936,
                                      tie_word_embeddings=True)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                        head_dim=128, vocab_size=151936, num_experts=128, num_experts_per_tok=8)),
    "qwen3-moe-sparse-step": ("qwen3_moe", dict(hidden_size=512, intermediate_size=1536, moe_intermediate_size=256,
                                                num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                                                vocab_size=3200, num_experts=16, num_experts_per_tok=2,
                                                decoder_sparse_step=2, mlp_only_layers=[3])),
    "mixtral-8x7b": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                     num_local_experts=8, num_experts_per_tok=2)),
    "deepseek-v2-lite": ("deepseek_v2", dict(hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                                             num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
                                             vocab_size=102400, q_lora_rank=None, kv_lora_rank=512,
                                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                             n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
                                             first_k_dense_replace=1)),
    "deepseek-v3": ("deepseek_v3", dict()),  # DeepseekV3Config's defaults are DeepSeek-V3's dims
    "gpt-oss-120b": ("gpt_oss", dict()),  # GptOssConfig's defaults are gpt-oss-120b's dims
    "gpt2": ("gpt2", dict()),
    "pythia-1.4b": ("gpt_neox", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                                     num_attention_heads=16, vocab_size=50304, max_position_embeddings=2048)),
}  # fmt: skip


def _meta_count(model_type: str, kwargs: dict[str, Any], path: Path) -> int:
    """Parameters of transformers' model of this config (meta device), after writing its config.json."""
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    cfg.to_json_file(str(path))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    # DeepSeek-V3's router correction bias is a buffer in transformers but a tensor of the checkpoint
    # (model.safetensors.index.json lists mlp.gate.e_score_correction_bias), so the published 671B counts it.
    return n + sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))


def _as_transformers_4(data: dict[str, Any]) -> dict[str, Any]:
    """The same config with the field names transformers 4 wrote (and OpenAI's gpt-oss top-k name)."""
    out = dict(data)
    if out.get("model_type") == "qwen3_moe" and "num_local_experts" in out:
        out["num_experts"] = out.pop("num_local_experts")  # transformers 4 Qwen3MoeConfig.num_experts
    if out.get("model_type") == "gpt_oss":
        out["experts_per_token"] = out.pop("num_experts_per_tok")  # openai/gpt-oss config.json
    rope = out.pop("rope_parameters", None)  # transformers 4: rope_theta + rope_scaling
    if isinstance(rope, dict):
        out["rope_theta"] = rope.get("rope_theta", 10000.0)
        if rope.get("rope_type", "default") != "default":
            out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    out["transformers_version"] = "4.57.1"
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_param_count_equals_transformers_meta_model(case: str, tmp_path: Path) -> None:
    model_type, kwargs = CASES[case]
    path = tmp_path / "config.json"
    expected = _meta_count(model_type, kwargs, path)
    spec = from_hf_config(tmp_path)
    assert spec.param_count() == expected
    old = tmp_path / "v4"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(_as_transformers_4(json.loads(path.read_text()))))
    assert from_hf_config(old).model_dump(exclude={"name"}) == spec.model_dump(exclude={"name"})


def test_qwen3_30b_a3b_written_by_transformers_5_is_the_moe_model(tmp_path: Path) -> None:
    """Issue 30: transformers 5 writes ``num_local_experts``; it loaded as a dense 3.3B model."""
    cfg = transformers.AutoConfig.for_model("qwen3_moe", **CASES["qwen3-30b-a3b"][1])
    cfg.to_json_file(str(tmp_path / "config.json"))
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["num_local_experts"] == 128 and "num_experts" not in data
    spec = from_hf_config(tmp_path)
    assert spec.moe is not None and spec.moe.n_experts == 128
    assert round(spec.param_count() / 1e9, 1) == 30.5  # model card: "30.5B in total"


@pytest.mark.parametrize(
    ("case", "field"),
    [("mixtral-8x7b", "num_local_experts"), ("qwen3-30b-a3b", "num_local_experts"),
     ("deepseek-v3", "n_routed_experts"), ("gpt-oss-120b", "num_local_experts")],
)  # fmt: skip
def test_moe_config_without_expert_count_is_an_error_naming_the_field(
    case: str, field: str, tmp_path: Path
) -> None:
    model_type, kwargs = CASES[case]
    data = transformers.AutoConfig.for_model(model_type, **kwargs).to_dict()
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        data.pop(key, None)
    with pytest.raises(ConfigError) as exc:
        from_hf_config(data)
    assert exc.value.problems[0].path == f"model.hf_config.{field}"
    assert "expert count" in exc.value.problems[0].message


def test_dense_family_with_experts_is_refused() -> None:
    data = transformers.AutoConfig.for_model("qwen3", **CASES["qwen3-8b"][1]).to_dict()
    data["num_local_experts"] = 128
    with pytest.raises(ConfigError) as exc:
        from_hf_config(data)
    assert exc.value.problems[0].path == "model.hf_config.model_type"
    assert "num_local_experts=128" in exc.value.problems[0].message
