"""Korthikanti et al. 2022, Figure 1: per-GPU memory of GPT 22B-1T on A100, within 5 %.

Figure 1 values (GiB per GPU; as transcribed by calculon-ai/calculon ``calculon/llm/validation.py``,
quoted in validation/README.md): parameters + optimizer state, and activations with no recompute
and with sequence parallelism + selective recompute. Layouts are the paper's Table 5 rows (TP 8,
PP 1/8/35/64, micro-batch 4/1/1/1, interleaving 1/3/3/1, sequence 2048, vocab 51200).

The figure's conventions, checked against its numbers: the parameters are the transformer layers'
(12 L h^2, no embeddings) at 18 bytes each (bf16 weights, fp32 gradients, fp32 Adam master + 2
moments; no distributed optimizer), and the activations are those of the first pipeline stage, which
holds L layers' worth of micro-batches under 1F1B, times, when interleaved, the factor 1 + (p-1)/(p v)
(Korthikanti sec. 4.2.3 / Megatron ``theoretical_memory_usage``).
"""

from __future__ import annotations

import pytest

from simtrain.lower.memory import activation_shape, layer_activation_bytes, static_memory
from simtrain.spec.config import LayoutConfig, TrainConfig
from simtrain.spec.model import ModelSpec

GiB = 1024.0**3

# name: (layers, hidden, heads, pp, micro-batch, vpp, params+optimizer GiB, activations none GiB, SP+selective GiB)
FIGURE_1 = {
    "22B": (48, 6144, 64, 1, 4, 1, 45.56, 59.25, 9.56),
    "175B": (96, 12288, 96, 8, 1, 3, 45.56, 66.84, 12.35),
    "530B": (105, 20480, 128, 35, 1, 3, 31.64, 114.02, 23.08),
    "1T": (128, 25600, 160, 64, 1, 1, 32.96, 131.25, 26.56),
}


def _gpt(layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name="gpt", n_layers=layers, hidden=hidden, n_heads=heads, ffn_hidden=4 * hidden,
                     activation="gelu", norm="layernorm", position="learned", vocab=51200, max_position=2048,
                     tied_embeddings=True, linear_bias=True)


@pytest.mark.parametrize("name", list(FIGURE_1))
def test_parameters_and_optimizer_within_5_percent(name: str) -> None:
    layers, hidden, heads, pp, mbs, vpp, want, _, _ = FIGURE_1[name]
    model = _gpt(layers, hidden, heads)
    layout = LayoutConfig(tp=8, pp=pp)
    params = model.layer_params() * layers / (8 * pp)
    train = TrainConfig(global_batch_seqs=8, grad_dtype="fp32")  # Megatron-LM 2022: fp32 main_grad
    mem = static_memory(params, model.layer_params() / 8, layers // pp, layout, train, shard=1, gpu_context_bytes=0.0)
    got = (mem["weights"] + mem["grads"] + mem["optimizer"]) / GiB
    assert got == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize("name", list(FIGURE_1))
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_activations_within_5_percent(name: str, recompute: str) -> None:
    layers, hidden, heads, pp, mbs, vpp, _, want_none, want_sel = FIGURE_1[name]
    model = _gpt(layers, hidden, heads)
    sp = recompute == "selective"
    layout = LayoutConfig(tp=8, pp=pp, vpp=vpp, sequence_parallel=sp, recompute=recompute)
    train = TrainConfig(seq_len=2048, micro_batch_size=mbs, global_batch_seqs=8 * pp * mbs,
                        attention_kernel="unfused", dropout=True)
    per_layer = layer_activation_bytes(model, activation_shape(train, layout, model), recompute_attention=sp)
    interleave = 1 + (pp - 1) / (pp * vpp) if vpp > 1 else 1.0
    got = per_layer * layers * interleave / GiB
    assert got == pytest.approx(want_sel if sp else want_none, rel=0.05)
