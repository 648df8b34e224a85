"""The one layer description (``simtrain.spec.layer_desc``) against the counters it replaced.

Facts of a model that the layer description must reproduce exactly: parameter counts, model FLOPs
and activation bytes through the public API of ``simtrain.spec.model``, ``simtrain.lower.flops`` and
``simtrain.lower.memory``. ``tests/data/layer_desc/snapshot.json`` was written by ``facts`` below run
against the code *before* the layer description (main at 8961681, where model.py, flops.py and
memory.py counted each layer independently), so the refactored code is compared with independent
goldens: ints exactly, floats bit for bit.

Regenerate (only when a number is meant to move, and say why): ``python tests/test_layer_desc.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from simtrain.lower.flops import layer_forward_flops_per_token, model_flops_per_token
from simtrain.lower.memory import (
    ActivationShape,
    backward_transient_bytes,
    layer_activation_bytes,
    mlp_intermediate_bytes,
    op_sac_activation_bytes,
    torch_cp_backward_transient_bytes,
    weight_grad_input_bytes,
)
from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.layer_desc import (
    MLP,
    Attention,
    Component,
    LatentAttention,
    LayerDesc,
    Linear,
    MoE,
    Norm,
    Projection,
    SavedBytes,
    SavePolicy,
    TPStyle,
)
from simtrain.spec.model import ModelSpec, list_presets, preset
from simtrain.spec.model_spec import ModelSpec as SpecModuleModelSpec

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
            row["routed"] = m.layer_routed_expert_params(i)
            row["flops"] = [layer_forward_flops_per_token(m, i, s) for s in (100, 4096)]
        for sname, a in SHAPES.items():
            row[f"{sname}:opsac"] = [op_sac_activation_bytes(m, a, i), op_sac_activation_bytes(m, a, i, compiled=True)]
            row[f"{sname}:wgrad"] = weight_grad_input_bytes(m, a, i)
            row[f"{sname}:transient"] = backward_transient_bytes(m, a, i)
            row[f"{sname}:mlp_inter"] = mlp_intermediate_bytes(m, a, i)
            row[f"{sname}:cp_ring"] = torch_cp_backward_transient_bytes(m, a, 4)
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


# ---- closed forms (independent of the description) ---------------------------------------------


def test_published_totals() -> None:
    """LLaMA-2 7B: 6,738,415,616 (HF safetensors total, "6.74B" in Touvron et al. 2023); GPT-3:
    Brown et al. 2020 Table 2.1 layout gives 174.6B (12·l·h² + 13·l·h + (V + s)·h + 2h)."""
    assert preset("llama2-7b").param_count() == 6_738_415_616
    n, h, v, s = 96, 12288, 50257, 2048
    assert preset("gpt3-175b").param_count() == 12 * n * h * h + 13 * n * h + (v + s) * h + 2 * h
    assert round(preset("gpt3-175b").param_count() / 1e8) == 1746


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b", "llama2-70b"])
@pytest.mark.parametrize("seq", [2048, 8192])
def test_dense_layer_forward_flops_are_twice_the_weights_plus_attention(name: str, seq: int) -> None:
    """2 x (h·(a·d + 2·g·d) + a·d·h + (n_up + 1)·h·f) + causal QK^T and AV: 2·2·(s/2)·d·a."""
    m = preset(name)
    h, a, g, d, f = m.hidden, m.n_heads, m.kv_heads, m.hidden // m.n_heads, m.ffn_hidden
    n_up = 2 if m.activation == "swiglu" else 1
    weights = h * (a * d + 2 * g * d) + a * d * h + (n_up + 1) * h * f
    assert layer_forward_flops_per_token(m, 0, seq) == 2 * weights + 2 * 2 * (seq / 2) * d * a
    assert model_flops_per_token(m, seq) == 3 * (m.n_layers * (2 * weights + 2 * seq * h) + 2 * h * m.vocab)


def test_korthikanti_34_sbh_exactly() -> None:
    """GPT-3 layer, no TP, unfused attention with dropout: 34·sbh + 5·a·s²·b bytes (Table 2)."""
    m = preset("gpt3-175b")
    a = ActivationShape(b=1, s=2048, t=1, sp=False, flash=False, dropout=True)
    sbh = 2048 * m.hidden
    assert layer_activation_bytes(m, a) == 34 * sbh + 5 * m.n_heads * 2048 * 2048


# ---- the description itself --------------------------------------------------------------------


def test_blocks_are_typed_component_lists() -> None:
    llama, ds, oss = preset("llama3-8b"), preset("deepseek-v3"), preset("gpt-oss-120b")
    assert [type(c) for c in llama.layer(0).components] == [Norm, Attention, Norm, MLP]
    assert [type(c) for c in ds.layer(0).components] == [Norm, LatentAttention, Norm, MLP]
    assert [type(c) for c in ds.layer(3).components] == [Norm, LatentAttention, Norm, MoE]
    assert ds.layer(ds.n_layers).ffn == ds.moe_component()  # the MTP block is an MoE block
    assert [type(c) for c in ds.mtp_around_block().components] == [Norm, Norm, Projection, Norm]
    assert (oss.layer(0).attention.core.window, oss.layer(1).attention.core.window) == (128, None)
    assert [lin.name for lin in llama.layer(0).attention.linears()] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert [(lin.name, lin.tp) for lin in ds.layer(0).attention.linears()] == [
        ("q_a_proj", TPStyle.REP), ("q_b_proj", TPStyle.COL), ("kv_a_proj_with_mqa", TPStyle.REP),
        ("kv_b_proj", TPStyle.COL), ("o_proj", TPStyle.ROW)]  # fmt: skip
    assert Linear("o_proj", 4096, 1024, TPStyle.ROW).per_rank(8) == (512, 1024)
    assert SpecModuleModelSpec is ModelSpec  # simtrain.spec.model re-exports the one class


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt3-175b"])
def test_model_totals_are_sums_over_the_described_blocks(name: str) -> None:
    m = preset(name)
    blocks = sum(m.layer(i).params() for i in range(m.n_layers))
    head = 0 if m.tied_embeddings else m.vocab * m.hidden
    assert m.param_count() == blocks + m.final_norm_params() + m.vocab * m.hidden + m.position_params() + head
    mtp = sum(m.layer(i).params() for i in range(m.n_layers, m.n_layers + m.mtp_depth))
    assert m.mtp_params() == mtp + m.mtp_depth * (2 * m.hidden * m.hidden + 3 * m.final_norm_params())


# ---- a new block type, declared once here -----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ToyMixer(Component):
    """A gated SSM-like mixer (Mamba-style in/out projections, a per-channel decay): declared only here."""

    hidden: int
    state: int

    def linears(self) -> tuple[Linear, ...]:
        return (Linear("in_proj", self.hidden, 2 * self.state, TPStyle.COL),
                Linear("out_proj", self.state, self.hidden, TPStyle.ROW))  # fmt: skip

    def params(self) -> int:
        return sum(lin.params for lin in self.linears()) + self.state  # + decay vector A

    def seq_flops_per_token(self, seq_len: int) -> float:
        return 6.0 * self.state  # the scan: a few FLOPs per state element, independent of s

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        # the in-projection's input (bf16), its 2·state outputs (bf16) and an fp32 state per token
        return SavedBytes(linear_inputs=2.0 * a.tokens * self.hidden,
                          sharded=2.0 * a.tokens * 2 * self.state + 4.0 * a.tokens * self.state)  # fmt: skip


class HybridSpec(ModelSpec):
    """Every block of the base model gets a norm + ToyMixer after its MLP; only ``layer`` changes."""

    def layer(self, i: int | None = None) -> LayerDesc:
        base = super().layer(i)
        return LayerDesc((*base.components, self.norm_component(), ToyMixer(self.hidden, 2 * self.hidden)))


def test_a_new_block_type_is_described_once() -> None:
    base = preset("llama3-8b")
    hybrid = HybridSpec(**base.model_dump())
    h, n, state = base.hidden, base.n_layers, 2 * base.hidden
    toy = ToyMixer(h, state)
    # parameters: counted once per block, in totals, active counts and per-layer counts alike
    extra_params = 2 * h * state + state * h + state + h  # in/out projections, decay, the extra RMSNorm
    assert toy.params() + h == extra_params
    assert hybrid.layer_params(5) - base.layer_params(5) == extra_params
    assert hybrid.param_count() - base.param_count() == n * extra_params
    assert hybrid.active_param_count() - base.active_param_count() == n * extra_params
    # model FLOPs: 3 x (2 x the new GEMM weights + its scan), every block
    for seq in (2048, 8192):
        per_layer = 2 * (2 * h * state + state * h) + 6.0 * state
        assert layer_forward_flops_per_token(hybrid, 3, seq) - layer_forward_flops_per_token(base, 3, seq) == per_layer
        gained = model_flops_per_token(hybrid, seq) - model_flops_per_token(base, seq)
        assert gained == pytest.approx(3 * n * per_layer, rel=1e-12)
    # saved activations: the norm's input and output and the mixer's tensors, sharded as declared
    for a in SHAPES.values():
        t, tokens = a.t, a.tokens
        replicated = 2.0 * tokens * h  # the new norm's input
        linear_inputs = 2.0 * tokens * h + 2.0 * tokens * h  # the norm's output + the mixer's input
        if a.sp:
            replicated /= t
            linear_inputs = linear_inputs if a.gathered_inputs else linear_inputs / t
        sharded = (4.0 * tokens * state + 4.0 * tokens * state) / t
        got = layer_activation_bytes(hybrid, a, layer=0) - layer_activation_bytes(base, a, layer=0)
        assert got == pytest.approx(replicated + linear_inputs + sharded, rel=1e-12)
        # layernorm recompute drops the new norm's output like the others
        got_ln = (layer_activation_bytes(hybrid, a, layer=0, recompute=("layernorm",))
                  - layer_activation_bytes(base, a, layer=0, recompute=("layernorm",)))  # fmt: skip
        dropped = 2.0 * tokens * h / (t if a.sp and not a.gathered_inputs else 1)
        assert got_ln == pytest.approx(got - dropped, rel=1e-12)


def test_unknown_stack_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown activation stack 'eager'; known: fused, eager_hf"):
        layer_activation_bytes(preset("llama3-8b"), SHAPES["plain"], stack="eager")
