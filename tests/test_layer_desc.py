"""The one layer description (``simtrain.layer_desc``) against the counters it replaced.

Facts of a model that the layer description must reproduce exactly: parameter counts, model FLOPs
and activation bytes through the public API of ``simtrain.model``, ``simtrain.flops`` and
``simtrain.memory``. ``tests/data/layer_desc/snapshot.json`` was written by this module from the code
*before* the layer description (commit "layer description: snapshot of the old counters"), so
``tests/test_layer_desc.py`` compares the refactored code against independent goldens.

Regenerate (only when a number is meant to move, and say why): ``python tests/test_layer_desc.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simtrain.flops import layer_forward_flops_per_token, model_flops_per_token
from simtrain.memory import (
    ActivationShape,
    backward_transient_bytes,
    layer_activation_bytes,
    mlp_intermediate_bytes,
    op_sac_activation_bytes,
    weight_grad_input_bytes,
)
from simtrain.model import ModelSpec, from_hf_config, list_presets, preset

HERE = Path(__file__).parent
SNAPSHOT = HERE / "data" / "layer_desc" / "snapshot.json"
HF_NAMES = ("deepseek-v2-lite", "gpt2", "pythia-1.4b", "qwen2-7b", "qwen3-8b", "mistral-7b")

SHAPES = {
    "plain": ActivationShape(b=1, s=4096, t=1, sp=False, flash=True, dropout=False),
    "tp8_sp_unfused": ActivationShape(b=2, s=2048, t=8, sp=True, flash=False, dropout=True, expert_load=1.37),
    "tp4_dtensor": ActivationShape(b=1, s=8192, t=4, sp=True, flash=True, dropout=False, gathered_inputs=True),
    "tp2_nosp": ActivationShape(b=3, s=1024, t=2, sp=False, flash=False, dropout=False),
}
RECOMPUTE: dict[str, tuple[bool, tuple[str, ...]]] = {
    "none": (False, ()),
    "core_attn": (True, ()),
    "layernorm": (False, ("layernorm",)),
    "mla_up_proj": (False, ("mla_up_proj",)),
    "act": (False, ("act",)),
    "all": (True, ("layernorm", "mla_up_proj", "act")),
}


def models() -> dict[str, ModelSpec]:
    """Every preset and a few HF configs (keys ``hf:<name>``)."""
    out = {name: preset(name) for name in list_presets()}
    out.update({f"hf:{n}": from_hf_config(HERE / "data" / "hf" / n / "config.json") for n in HF_NAMES})
    return out


def probe_layers(m: ModelSpec) -> list[int]:
    """Layer indices covering every distinct block: first dense, first MoE, a sliding and a full one,
    the last main block and the MTP blocks."""
    picks = {0, m.n_layers - 1, *range(m.n_layers, m.n_layers + m.mtp_depth)}
    if m.moe_layer_indices():
        picks.add(m.moe_layer_indices()[0])
    if m.dense_layer_indices():
        picks.add(m.dense_layer_indices()[-1])
    for kind in ("sliding", "full"):
        picks.update([i for i in range(m.n_layers) if m.attention_kind(i) == kind][:1])
    return sorted(picks)


def facts(m: ModelSpec) -> dict[str, Any]:
    """All numbers of ``m`` the layer description feeds (ints exact, floats as repr via JSON)."""
    f: dict[str, Any] = {
        "param_count": m.param_count(), "param_count_mtp": m.param_count(include_mtp=True),
        "active": m.active_param_count(), "active_no_emb": m.active_param_count(include_input_embedding=False),
        "active_mtp": m.active_param_count(include_mtp=True), "non_embedding": m.non_embedding_params(),
        "embedding": m.embedding_params(), "position": m.position_params(), "lm_head": m.lm_head_params(),
        "final_norm": m.final_norm_params(), "attention": m.attention_params(),
        "attention_gemm": m.attention_gemm_params(), "mlp": m.mlp_params(),
        "norms_per_layer": m.norm_params_per_layer(), "mtp": m.mtp_params(),
        "routed_experts": m.routed_expert_param_count() if m.is_moe else 0,
        "routed_experts_mtp": m.routed_expert_param_count(include_mtp=True) if m.is_moe else 0,
        "layers": {}, "model_flops": {},
    }  # fmt: skip
    if m.is_moe:
        f.update(expert=m.expert_params(), shared=m.shared_expert_params(), router=m.router_params(),
                 moe=m.moe_params(), moe_active=m.moe_active_params())
    for seq in (2048, 8192):
        f["model_flops"][str(seq)] = [model_flops_per_token(m, seq), model_flops_per_token(m, seq, include_mtp=False)]
    layers: list[int | None] = [None, *probe_layers(m)]
    for i in layers:
        row: dict[str, Any] = {}
        if i is not None:
            row["params"] = m.layer_params(i)
            row["active"] = m.layer_active_params(i)
            row["routed"] = m.layer_routed_expert_params(i) if m.is_moe else 0
            row["flops"] = [layer_forward_flops_per_token(m, i, s) for s in (100, 4096)]
        for sname, a in SHAPES.items():
            row[f"{sname}:opsac"] = [op_sac_activation_bytes(m, a, i), op_sac_activation_bytes(m, a, i, compiled=True)]
            row[f"{sname}:wgrad"] = weight_grad_input_bytes(m, a, i)
            row[f"{sname}:transient"] = backward_transient_bytes(m, a, i)
            row[f"{sname}:mlp_inter"] = mlp_intermediate_bytes(m, a, i)
            for rname, (core, mods) in RECOMPUTE.items():
                row[f"{sname}:{rname}"] = [layer_activation_bytes(m, a, core, i, mods, stack)
                                           for stack in ("fused", "eager_hf")]
        f["layers"][str(i)] = row
    return f


def all_facts() -> dict[str, Any]:
    return {name: facts(m) for name, m in models().items()}


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(all_facts(), indent=1, sort_keys=True) + "\n")
    print("wrote", SNAPSHOT)


SNAPSHOT_FACTS: dict[str, Any] = json.loads(SNAPSHOT.read_text())


@pytest.mark.parametrize("name", sorted(SNAPSHOT_FACTS))
def test_counts_flops_and_activations_match_the_old_code(name: str) -> None:
    """Every number the old independent counters gave, reproduced exactly (ints and float bits)."""
    assert facts(models()[name]) == SNAPSHOT_FACTS[name]
