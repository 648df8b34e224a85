"""Memory: Korthikanti activations, ZeRO static memory (reference Table C), ledger vs closed form."""

from __future__ import annotations

import pytest

from simtrain.lower.memory import ActivationShape, layer_activation_bytes, static_memory
from simtrain.spec.config import LayoutConfig, TrainConfig
from simtrain.spec.model import preset
from simtrain.studies.simulate import simulate

GPT3 = preset("gpt3-175b")
S, B = 2048, 1


def _shape(t: int = 1, sp: bool = False, flash: bool = False, dropout: bool = True) -> ActivationShape:
    return ActivationShape(b=B, s=S, t=t, sp=sp, flash=flash, dropout=dropout)


def test_gpt3_dims() -> None:
    assert (GPT3.hidden, GPT3.n_heads, GPT3.ffn_hidden, GPT3.activation) == (12288, 96, 4 * 12288, "gelu")


def _sbh() -> float:
    return float(S * B * GPT3.hidden)


def _attn_term(t: int) -> float:
    h, a = GPT3.hidden, GPT3.n_heads
    return 5.0 * a * S / (h * t)


def test_korthikanti_no_parallelism() -> None:
    got = layer_activation_bytes(GPT3, _shape())
    assert got == pytest.approx(_sbh() * (34 + _attn_term(1)), rel=0.01)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tp_without_sp(t: int) -> None:
    got = layer_activation_bytes(GPT3, _shape(t=t))
    assert got == pytest.approx(_sbh() * (10 + 24 / t + _attn_term(t)), rel=0.01)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tp_with_sp(t: int) -> None:
    got = layer_activation_bytes(GPT3, _shape(t=t, sp=True))
    assert got == pytest.approx(_sbh() * (34 / t + _attn_term(t)), rel=0.01)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_selective_recompute(t: int) -> None:
    sp = t > 1
    got = layer_activation_bytes(GPT3, _shape(t=t, sp=sp), recompute_attention=True)
    assert got == pytest.approx(34 * _sbh() / t, rel=0.01)
    no_sp = layer_activation_bytes(GPT3, _shape(t=t), recompute_attention=True)
    assert no_sp == pytest.approx(_sbh() * (10 + 24 / t), rel=0.01)


@pytest.mark.parametrize("t,sp", [(1, False), (4, False), (8, True)])
def test_flash_attention_drops_the_quadratic_term(t: int, sp: bool) -> None:
    unfused = layer_activation_bytes(GPT3, _shape(t=t, sp=sp))
    flash = layer_activation_bytes(GPT3, _shape(t=t, sp=sp, flash=True))
    a = GPT3.n_heads
    lse = 4.0 * a * S * B / t
    assert unfused - flash == pytest.approx(5.0 * a * S * S * B / t - lse, rel=1e-9)
    rep = 10 / t if sp else 10
    assert flash == pytest.approx(_sbh() * (rep + 24 / t) + lse, rel=0.01)


def test_llama_style_layer_formula() -> None:
    # Table C, Llama-style (RMSNorm, no dropout, FA, GQA, SwiGLU): sbh(12 + 4g/a + 6f/h) + 4asb
    m = preset("llama3-70b")
    sh = ActivationShape(b=1, s=8192, t=1, sp=False, flash=True, dropout=False)
    sbh = 8192.0 * m.hidden
    g, a, f, h = m.kv_heads, m.n_heads, m.ffn_hidden, m.hidden
    expect = sbh * (12 + 4 * g / a + 6 * f / h) + 4 * a * 8192
    assert layer_activation_bytes(m, sh) == pytest.approx(expect, rel=0.01)


# -- static memory (ZeRO paper / Table C) --------------------------------------------------------

PSI = 1e9
STATIC = ("weights", "grads", "optimizer")


def _static(zero: int, n: int, grad_dtype: str = "bf16", fsdp: str = "none") -> float:
    lay = LayoutConfig(dp=n, zero_stage=zero, fsdp=fsdp)
    tr = TrainConfig(grad_dtype=grad_dtype, global_batch_seqs=n)
    mem = static_memory(PSI, PSI / 100, 100, lay, tr, n, 0.0)
    return sum(mem[k] for k in STATIC)


@pytest.mark.parametrize(("stack", "grad_dtype", "grad_bytes"), [
    ("megatron-te", None, 2.0),     # NeMo / Megatron-Bridge performance recipes reduce gradients in bf16
    ("megatron-core", None, 4.0),   # Megatron-LM accumulates into fp32 main_grad
    ("torchtitan-compile", None, 4.0), ("megatron-te", "fp32", 4.0), ("megatron-core", "bf16", 2.0),
])
def test_gradient_dtype_is_the_runs_or_its_stacks(stack: str, grad_dtype: str | None, grad_bytes: float) -> None:
    train = TrainConfig(stack=stack, grad_dtype=grad_dtype)
    assert train.grad_bytes == grad_bytes
    mem = static_memory(PSI, PSI / 100, 100, LayoutConfig(dp=8, zero_stage=1), train, 8, 0.0)
    assert mem["grads"] == pytest.approx(grad_bytes * PSI)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_zero_stages_bf16_grads(n: int) -> None:
    assert _static(0, n) == pytest.approx(16 * PSI)
    assert _static(1, n) == pytest.approx(4 * PSI + 12 * PSI / n)
    assert _static(2, n) == pytest.approx(2 * PSI + 14 * PSI / n)
    assert _static(3, n) == pytest.approx(16 * PSI / n)
    assert _static(0, n, fsdp="full") == pytest.approx(16 * PSI / n)


@pytest.mark.parametrize("n", [2, 8])
def test_zero_stages_fp32_grads(n: int) -> None:
    # Megatron (fp32 main_grad): 18 Psi without the distributed optimizer, 6 Psi + 12 Psi / N with it
    assert _static(0, n, "fp32") == pytest.approx(18 * PSI)
    assert _static(1, n, "fp32") == pytest.approx(6 * PSI + 12 * PSI / n)
    assert _static(2, n, "fp32") == pytest.approx(2 * PSI + 16 * PSI / n)


def test_sgd_keeps_less_optimizer_state() -> None:
    lay = LayoutConfig(dp=1)
    adam = static_memory(PSI, 0, 1, lay, TrainConfig(global_batch_seqs=1), 1, 0.0)
    sgd = static_memory(PSI, 0, 1, lay, TrainConfig(global_batch_seqs=1, optimizer="sgd"), 1, 0.0)
    assert adam["optimizer"] == pytest.approx(12 * PSI)
    assert sgd["optimizer"] == pytest.approx(8 * PSI)


# -- end to end: the engine's ledger against the closed form --------------------------------------

TINY = dict(name="tiny", n_layers=8, hidden=512, n_heads=8, ffn_hidden=2048, activation="gelu",
            norm="layernorm", position="learned", max_position=2048, vocab=4096, tied_embeddings=True,
            linear_bias=True)
LLAMA_TINY = dict(name="ltiny", n_layers=8, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1408,
                  activation="swiglu", norm="rmsnorm", position="rope", vocab=8192, tied_embeddings=False,
                  linear_bias=False)

E2E = [
    dict(layout=dict(dp=8), train=dict(global_batch_seqs=16)),
    dict(layout=dict(pp=2, dp=4, zero_stage=1), train=dict(global_batch_seqs=16)),
    dict(layout=dict(pp=4, dp=2, recompute="full"), train=dict(global_batch_seqs=16)),
    dict(layout=dict(pp=4, dp=2, recompute="full", recompute_layers=1), train=dict(global_batch_seqs=8)),
    dict(layout=dict(pp=2, tp=2, dp=2, vpp=2, sequence_parallel=True, recompute="selective"),
         train=dict(global_batch_seqs=8, attention_kernel="unfused")),
    dict(layout=dict(pp=2, tp=4, zero_stage=2, dp=1), train=dict(global_batch_seqs=4)),
    dict(layout=dict(pp=1, dp=8, zero_stage=3), train=dict(global_batch_seqs=16)),
    dict(layout=dict(pp=2, dp=4, fsdp="full"), train=dict(global_batch_seqs=8)),
    dict(layout=dict(pp=1, dp=8, fsdp="hybrid", fsdp_shard_size=4, recompute="selective"),
         train=dict(global_batch_seqs=16, attention_kernel="unfused")),
    dict(layout=dict(pp=4, dp=2, schedule="gpipe"), train=dict(global_batch_seqs=8)),
    dict(model="llama", layout=dict(pp=2, tp=2, dp=2, sequence_parallel=True), train=dict(global_batch_seqs=8)),
    dict(model="llama", layout=dict(pp=2, dp=4, fsdp="full", recompute="op_sac"),
         train=dict(global_batch_seqs=8, stack="torchtitan-eager")),
    dict(model="llama", layout=dict(tp=2, dp=2, sequence_parallel=True, recompute="op_sac", schedule="zb_h1", pp=2),
         train=dict(global_batch_seqs=8)),
]
STATIC_KEYS = ("weights", "grads", "optimizer", "comm_buffers", "workspace", "context", "pp_buffers")


def _e2e_cfg(case: dict) -> dict:
    model = LLAMA_TINY if case.get("model") == "llama" else TINY
    train = dict(seq_len=1024, **case["train"])
    return dict(model=model, hardware=dict(n_nodes=1), layout=case["layout"], train=train)


@pytest.mark.parametrize("case", E2E, ids=lambda c: str(c["layout"]))
def test_ledger_peak_matches_closed_form(case: dict) -> None:
    res = simulate(_e2e_cfg(case))
    assert len(res.memory) == case["layout"].get("pp", 1)
    for m in res.memory:
        assert m.peak_bytes == pytest.approx(m.closed_form_peak_bytes, rel=0.01)
        static = sum(m.components.get(k, 0.0) for k in STATIC_KEYS)
        values = [v for _, v in m.timeline]
        # dynamic memory never negative, and everything allocated during the step is freed
        assert min(values) >= static * (1 - 1e-12)
        assert values[-1] == pytest.approx(static, rel=1e-9)
        # weights: 0 under torch FSDP, whose fp32 shards are the optimizer's master copies
        assert m.peak_bytes >= m.components.get("weights", 0.0) + m.components["optimizer"] > 0
        assert m.components.get("activations", 0.0) > 0
        assert m.peak_bytes == pytest.approx(sum(m.components.values()), rel=1e-9)


def test_recompute_and_sharding_reduce_memory() -> None:
    base = dict(layout=dict(pp=2, dp=4), train=dict(global_batch_seqs=16))

    def peak(**lay):
        case = dict(base, layout=dict(base["layout"], **lay))
        return max(m.peak_bytes for m in simulate(_e2e_cfg(case)).memory)

    def acts(**lay):
        case = dict(base, layout=dict(base["layout"], **lay))
        return max(m.components.get("activations", 0.0) for m in simulate(_e2e_cfg(case)).memory)

    assert acts(recompute="full") < acts()
    assert peak(zero_stage=1) < peak()
    assert peak(zero_stage=3) < peak(zero_stage=1)


def test_first_stage_holds_p_microbatches() -> None:
    # Table C: 1F1B stage 0 keeps p micro-batches of its L/p layers in flight (m >= p)
    p = 4
    res = simulate(_e2e_cfg(dict(layout=dict(pp=p, dp=2), train=dict(global_batch_seqs=32))))
    res_m = simulate(_e2e_cfg(dict(layout=dict(pp=p, dp=2), train=dict(global_batch_seqs=64))))
    a0 = res.memory[0].components["activations"]
    assert res_m.memory[0].components["activations"] == pytest.approx(a0, rel=1e-9)  # independent of m
    a_last = res.memory[-1].components["activations"]
    assert a0 > a_last  # last stage holds one micro-batch (plus its head), first holds p


# -- torchtitan op-level SAC and the eager loss ----------------------------------------------------

def test_op_sac_saves_between_selective_and_full() -> None:
    """Op-level SAC keeps less than no recompute and more than full recompute, and re-runs kernels."""
    from simtrain.lower.memory import (
        activation_shape,
        layer_checkpoint_bytes,
        op_sac_activation_bytes,
        op_sac_recomputed,
    )
    from simtrain.spec.model import ModelSpec

    spec = ModelSpec(**LLAMA_TINY)
    shape = activation_shape(TrainConfig(global_batch_seqs=1, seq_len=1024), LayoutConfig(), spec)
    sac = op_sac_activation_bytes(spec, shape)
    assert layer_checkpoint_bytes(spec, shape) < sac < layer_activation_bytes(spec, shape)
    # torchtitan's counter recomputes the 2nd, 4th and 6th matmul: wk, wo (o_proj), w3
    assert [n for n, *_ in op_sac_recomputed(spec)] == ["k_proj", "o_proj", "w3"]

    def run(recompute: str) -> tuple[float, float]:
        res = simulate(_e2e_cfg(dict(model="llama", layout=dict(dp=8, recompute=recompute),
                                     train=dict(global_batch_seqs=8))))
        return res.breakdown_s["compute"], res.memory[0].components["activations"]

    (t_none, m_none), (t_sac, m_sac), (t_full, m_full) = run("none"), run("op_sac"), run("full")
    assert t_none < t_sac < t_full
    assert m_full < m_sac < m_none


def test_eager_loss_holds_fp32_gradients() -> None:
    """An eager fp32 cross-entropy (torchtitan) peaks higher than a fused one by two fp32 logit tensors and
    the freed bf16 logits' block, which the caching allocator cannot reuse for them (2 + 2 x 4 B per logit)."""
    def peak(stack: str) -> float:
        res = simulate(_e2e_cfg(dict(model="llama", layout=dict(dp=8), train=dict(global_batch_seqs=8, stack=stack))))
        return res.memory[0].peak_bytes / (1 + 0.05)

    extra = peak("torchtitan-eager") - peak("torchtitan-compile")
    assert extra == pytest.approx((2 * 4.0 + 2.0) * 1024 * LLAMA_TINY["vocab"], rel=1e-6)


def test_loss_parallel_backward_holds_a_third_fp32_buffer() -> None:
    """torch's loss_parallel backward ((zeros + exp(x)) * grad) holds three fp32 logit-sized tensors
    beside the saved log-softmax, against two for aten's fused log_softmax backward; TP 1 has no
    loss_parallel. Either way the freed bf16 logits leave a 2 B-per-logit block no fp32 tensor fits."""
    from simtrain.lower.memory import loss_backward_transient_bytes
    from simtrain.spec.model import ModelSpec

    spec = ModelSpec(**LLAMA_TINY)
    logits = 4.0 * 2 * 1024 * LLAMA_TINY["vocab"]  # fp32, b=2, s=1024, unsharded
    for t, parallel, copies in ((4, True, 3), (4, False, 2), (1, True, 2)):
        a = ActivationShape(b=2, s=1024, t=t, sp=True, flash=True, dropout=False)
        hole = 2.0 * 2 * 1024 * LLAMA_TINY["vocab"] / t
        assert loss_backward_transient_bytes(spec, a, True, loss_parallel=parallel) == copies * logits / t + hole
        assert loss_backward_transient_bytes(spec, a, False, loss_parallel=parallel) == 0.0


def test_torch_pipelining_buffers() -> None:
    """torch.distributed.pipelining: one activation and one gradient receive buffer per micro-batch
    on every stage that receives them, and the last stage's output of every micro-batch (torchtitan's
    fp32 logits: ``self.output(h).float()``), for the whole step."""
    from simtrain.lower.memory import pipeline_stage_buffer_bytes
    from simtrain.spec.model import ModelSpec

    spec = ModelSpec(**LLAMA_TINY)
    a = ActivationShape(b=1, s=1024, t=2, sp=True, flash=True, dropout=False)
    edge, logits, m = 2.0 * 1024 * 512 / 2, 4.0 * 1024 * LLAMA_TINY["vocab"] / 2, 4
    assert pipeline_stage_buffer_bytes(spec, a, [0], 3, m) == m * edge  # first: gradients only
    assert pipeline_stage_buffer_bytes(spec, a, [1], 3, m) == 2 * m * edge
    assert pipeline_stage_buffer_bytes(spec, a, [3], 3, m) == m * (edge + logits)  # last: activations + outputs
    assert pipeline_stage_buffer_bytes(spec, a, [1, 3], 3, m) == m * (3 * edge + logits)  # interleaved rank

    def buffers(stack: str, pp: int) -> list[float]:
        res = simulate(_e2e_cfg(dict(model="llama", layout=dict(pp=pp, dp=8 // pp, fsdp="full"),
                                     train=dict(global_batch_seqs=8, stack=stack))))
        return [mem.components.get("pp_buffers", 0.0) for mem in res.memory]

    one = ActivationShape(b=1, s=1024, t=1, sp=False, flash=True, dropout=False)  # micro-batch 1: 2 per rank
    assert buffers("torchtitan-compile", 2) == [pipeline_stage_buffer_bytes(spec, one, [v], 1, 2) for v in (0, 1)]
    # Megatron-core allocates each receive buffer with its micro-batch (p2p_communication) and frees a sent
    # output's storage (deallocate_output_tensor): nothing held beyond the in-flight activations
    assert buffers("megatron-te", 2) == [0.0, 0.0]
    assert buffers("torchtitan-compile", 1) == [0.0]


def test_fsdp_prefetch_hides_parameter_gathers() -> None:
    """FSDP2-style prefetch: with one layer of prefetch the all-gathers overlap compute."""
    def exposed_dp(prefetch: int) -> float:
        cfg = _e2e_cfg(dict(model="llama", layout=dict(dp=8, fsdp="full", fsdp_prefetch_layers=prefetch),
                            train=dict(global_batch_seqs=8)))
        return simulate(cfg).breakdown_s["exposed_comm"]["dp"]

    assert exposed_dp(1) < 0.5 * exposed_dp(0)


@pytest.mark.parametrize("t", [2, 8])
def test_dtensor_sp_keeps_the_gathered_linear_inputs(t: int) -> None:
    """DTensor SP (torchtitan): the QKV and MLP inputs are saved all-gathered (2 + 2 sbh, not /t),
    in activations and in what a split backward's W reads; the norm inputs stay sharded."""
    import dataclasses

    from simtrain.lower.memory import activation_shape, weight_grad_input_bytes

    sharded = _shape(t=t, sp=True)
    gathered = dataclasses.replace(sharded, gathered_inputs=True)
    extra = 4 * _sbh() * (1 - 1 / t)
    assert layer_activation_bytes(GPT3, gathered) - layer_activation_bytes(GPT3, sharded) == pytest.approx(extra)
    assert weight_grad_input_bytes(GPT3, gathered) - weight_grad_input_bytes(GPT3, sharded) == pytest.approx(extra)
    # selective recompute of the norms drops the gathered inputs too (their outputs are the inputs)
    no_norm = layer_activation_bytes(GPT3, gathered, recompute=("layernorm",))
    assert layer_activation_bytes(GPT3, gathered) - no_norm == pytest.approx(4 * _sbh())
    # which stacks gather: torchtitan's DTensor TP with SP, not Megatron-core's, not without TP
    lay = LayoutConfig(tp=t, dp=1, sequence_parallel=True)
    for stack, expected in (("torchtitan-compile", True), ("megatron-te", False)):
        train = TrainConfig(seq_len=S, global_batch_seqs=1, micro_batch_size=1, stack=stack)
        assert activation_shape(train, lay, GPT3).gathered_inputs is expected
    train = TrainConfig(seq_len=S, global_batch_seqs=1, micro_batch_size=1, stack="torchtitan-compile")
    assert activation_shape(train, LayoutConfig(tp=1, dp=1), GPT3).gathered_inputs is False
