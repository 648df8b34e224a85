"""FP8 recipes, and symmetric == full on shrunk versions of the MoE/CP/DualPipe examples."""

from __future__ import annotations

import pytest

from simtrain.studies.simulate import simulate

# DeepSeek-V3 in miniature: MLA, 1 dense + 3 MoE layers with a shared expert, MTP, 16 experts top-4
TINY_DSV3 = dict(name="tiny-dsv3", n_layers=4, hidden=512, n_heads=8, ffn_hidden=1536, activation="swiglu",
                 norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False, linear_bias=False,
                 mla=dict(q_lora_rank=192, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16,
                          v_head_dim=32),
                 moe=dict(n_experts=16, top_k=4, ffn_hidden=256, n_shared_experts=1, first_k_dense=1),
                 mtp_depth=1)
DSV3 = dict(model=TINY_DSV3, hardware=dict(node="hgx-h800", n_nodes=2),
            layout=dict(pp=4, dp=4, ep=4, zero_stage=1, schedule="dualpipe", recompute="selective",
                        recompute_modules=["layernorm", "mla_up_proj", "act"]),
            train=dict(seq_len=1024, global_batch_seqs=32, precision="fp8", fp8_recipe="blockwise"))
MIXTRAL = dict(model=dict(TINY_DSV3, mla=None, mtp_depth=0, moe=dict(n_experts=8, top_k=2, ffn_hidden=512)),
               hardware=dict(n_nodes=1), layout=dict(pp=2, vpp=2, dp=4, ep=4, zero_stage=1),
               train=dict(seq_len=1024, global_batch_seqs=16))
LLAMA_CP = dict(model=dict(TINY_DSV3, mla=None, moe=None, mtp_depth=0, n_layers=6), hardware=dict(n_nodes=2),
                layout=dict(tp=2, cp=4, pp=2, vpp=2, dp=1, sequence_parallel=True, cp_comm="all_gather",
                            recompute="full", recompute_layers=1),
                train=dict(seq_len=8192, global_batch_seqs=4))


@pytest.mark.parametrize("cfg", [DSV3, MIXTRAL, LLAMA_CP], ids=["deepseek-v3", "mixtral", "405b-cp16"])
def test_shrunk_example_symmetric_equals_full(cfg: dict) -> None:
    sym, full = simulate(cfg, mode="symmetric"), simulate(cfg, mode="full")
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.01)
    for a, b in zip(sym.memory, full.memory, strict=True):
        assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=1e-6)
        assert a.peak_bytes == pytest.approx(a.closed_form_peak_bytes, rel=0.02)


H100 = dict(model="llama3-8b", hardware=dict(n_nodes=1), layout=dict(tp=8, sequence_parallel=True),
            train=dict(seq_len=4096, global_batch_seqs=8))


def test_fp8_is_faster_keeps_weight_copies_and_current_scaling_costs_more() -> None:
    bf16 = simulate(H100)
    fp8 = {r: simulate(H100, ["train.precision=fp8", f"train.fp8_recipe={r}"]) for r in ("delayed", "current")}
    assert fp8["delayed"].step_time_s < bf16.step_time_s
    assert fp8["current"].step_time_s > fp8["delayed"].step_time_s  # amax pass before every cast
    comps = fp8["delayed"].memory[0].components
    layer_params = 32 * 218_112_000 / 8  # llama3-8b blocks on one TP rank
    assert comps["fp8_weights"] == pytest.approx(2.0 * layer_params, rel=0.01)
    # linear-layer inputs saved as FP8: fewer activation bytes than BF16
    assert comps["activations"] < bf16.memory[0].components["activations"]
    # MFU is against the BF16 peak in every precision (README), so FP8 can only raise it by speed
    assert fp8["delayed"].mfu == pytest.approx(bf16.mfu * bf16.step_time_s / fp8["delayed"].step_time_s)


def test_fp8_needs_a_gpu_with_fp8() -> None:
    from simtrain.spec.errors import ConfigError
    with pytest.raises(ConfigError):
        simulate(dict(H100, hardware=dict(node="dgx-a100", n_nodes=1)), ["train.precision=fp8"])


@pytest.mark.parametrize("cfg", [DSV3, LLAMA_CP], ids=["ep-dualpipe", "cp"])
def test_trace_covers_every_stream(cfg: dict, tmp_path) -> None:
    """The Chrome trace names a thread for every stream the ops use (EP, CP, FSDP gathers...)."""
    import json

    from simtrain.engine.trace import write_chrome_trace
    r = simulate(cfg, trace=True)
    path = tmp_path / "t.json"
    write_chrome_trace(path, r.trace, r.stage_of)
    events = json.loads(path.read_text())["traceEvents"]
    used = {e["tid"] for e in events if e["ph"] == "X"}
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert used and used <= named
    assert path.stat().st_mode & 0o044  # readable by others (umask permitting), not mkstemp's 0600
