"""MoE costs beyond the expert GEMMs' FLOPs: per-expert tile quantisation of uneven routed rows
(simtrain.cost.grouped), Transformer Engine's FP8 row-alignment copies, the fused router's kernels and the
permutation's index kernels (simtrain.lower.blocks.moe)."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from simtrain.cost.costs import TILE_M, ComputeCostModel
from simtrain.cost.grouped import expected_tiles, routed_tile_factor
from simtrain.cost.host import C10D_COLLECTIVE_CPU_S
from simtrain.hardware.load import load_gpu
from simtrain.lower.blocks.moe import COUNT_BYTES, ROUTER_BYTES, SORT_MAP_BYTES, MoEKernels
from simtrain.lower.blocks.segments import Comm
from simtrain.lower.kernels import KernelDesc, MemoryBound
from simtrain.lower.layer_plan import build_block
from simtrain.plan.load import load_config
from simtrain.spec.collective_kinds import ALL_GATHER
from simtrain.studies.simulate import simulate

SMALL_MOE = dict(name="moe-small", n_layers=4, hidden=1024, n_heads=8, n_kv_heads=4, ffn_hidden=2048,
                 activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False,
                 linear_bias=False, moe=dict(n_experts=8, top_k=2, ffn_hidden=2048))
BASE = dict(model=SMALL_MOE, hardware=dict(n_nodes=1), layout=dict(dp=8, ep=8),
            train=dict(seq_len=2048, global_batch_seqs=16))


def _tiles_by_normal_dist(mean: float, tile: int) -> float:
    """E[ceil(X / tile)] for X ~ Normal(mean, sqrt(mean)), summed with the standard library's CDF."""
    x = NormalDist(mean, math.sqrt(mean))
    return sum(1.0 - x.cdf(j * tile) for j in range(int((mean + 10 * math.sqrt(mean)) / tile) + 2))


@pytest.mark.parametrize("mean", [3.0, 100.0, 128.0, 700.0, 2048.0, 4096.0, 30000.0])
def test_expected_tiles_match_an_independent_sum(mean: float) -> None:
    assert expected_tiles(mean, TILE_M) == pytest.approx(_tiles_by_normal_dist(mean, TILE_M), rel=1e-9, abs=1e-9)


def test_expected_tiles_closed_forms() -> None:
    """A mean on a tile boundary is exceeded half the time: 1.5 tiles at 128 rows; far from small, the
    expected padding tends to half a tile (64 rows)."""
    assert expected_tiles(128.0, 128) == pytest.approx(1.5, abs=1e-12)
    assert expected_tiles(0.0, 128) == 0.0
    m = 100_003.0
    assert expected_tiles(m, 128) * 128 - m == pytest.approx(64.0, abs=0.5)


def test_routed_tile_factor_only_on_routed_rows() -> None:
    """Forward and dgrad grouped GEMMs pad each expert's routed rows; wgrad's rows are the weight's; a
    plain GEMM is not routed."""
    m = 4096
    assert routed_tile_factor("expert.up", m, True, 128) == pytest.approx(32 / expected_tiles(m, 128))
    assert routed_tile_factor("expert.down.dgrad", m, True, 128) < 1.0
    assert routed_tile_factor("expert.up.wgrad", m, True, 128) == 1.0
    assert routed_tile_factor("mlp_up", m, False, 128) == 1.0


def test_grouped_gemm_time_by_hand() -> None:
    """One grouped expert GEMM on H100 BF16: 2mnk x groups FLOPs at peak x gemm_efficiency x the routed
    tile factor, plus one launch tail (it is compute-bound at this size)."""
    gpu = load_gpu("h100-sxm")
    cost = ComputeCostModel(gpu, "bf16")
    m, n, k, g = 2048, 1536, 2048, 16
    eff = cost.gemm_efficiency(m, n, k, g) * math.ceil(m / 128) / expected_tiles(m, 128)
    want = 2.0 * m * n * k * g / (gpu.bf16_flops_per_s * eff) + gpu.kernel_launch_s
    assert cost.gemm("expert.up", m, n, k, g, grouped=True).time_s == pytest.approx(want, rel=1e-12)
    # never faster than the balanced shape when the mean fills whole tiles (the padding only adds)
    balanced = 2.0 * m * n * k * g / (gpu.bf16_flops_per_s * cost.gemm_efficiency(m, n, k, g)) + gpu.kernel_launch_s
    assert cost.gemm("expert.up", m, n, k, g, grouped=True).time_s > balanced


def _kernels(run_overrides: list[str], backward: bool) -> list[KernelDesc]:
    run = load_config(BASE, run_overrides)
    b = build_block(run.model, run.layout, run.train)
    moe = run.model.moe_component()
    segs = b.moe_backward(moe) if backward else b.moe_forward(moe)
    return [k for s in segs if isinstance(s, tuple) for k in s]


def _by_name(ks: list[KernelDesc]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k in ks:
        if isinstance(k, MemoryBound):
            out.setdefault(k.name, []).append(k.bytes)
    return out


def test_fp8_alignment_copies_on_transformer_engine_only() -> None:
    """FP8 on a Transformer Engine stack: each routed copy is read and written into the padded buffer
    before the grouped GEMMs and out of it after (and their gradients in backward); BF16 and torchtitan
    (which pads inside its permutation indices) have none."""
    fp8 = ["train.precision=fp8", "train.fp8_recipe=delayed",
           'train.stack={"preset": "megatron-te", "fp8_expert_padding_copies": true}']
    run = load_config(BASE, fp8)
    b = build_block(run.model, run.layout, run.train)
    copies = b.T * 2 * run.model.hidden  # top-2 of 8 experts over 8 ranks: k x T copies arrive per rank
    fwd, bwd = _by_name(_kernels(fp8, False)), _by_name(_kernels(fp8, True))
    assert fwd["expert.fp8_pad"] == [pytest.approx(2 * 2.0 * copies)]
    assert fwd["expert.fp8_unpad"] == [pytest.approx(2 * 2.0 * copies)]
    assert bwd["expert.fp8_pad.bwd"] == bwd["expert.fp8_unpad.bwd"] == [pytest.approx(2 * 2.0 * copies)]
    # BF16; torchtitan (pads inside its permutation indices); and the presets, whose recipes pad in the router
    for other in (["train.stack=megatron-te"], ["train.precision=fp8", "train.stack=torchtitan-compile"],
                  ["train.precision=fp8", "train.fp8_recipe=delayed", "train.stack=megatron-te"]):
        assert not any("fp8_pad" in n or "fp8_unpad" in n for n in _by_name(_kernels(other, False)))


def test_fp8_alignment_copies_slow_the_step() -> None:
    """End to end: the same FP8 run with TE's padding copies (``fp8_expert_padding_copies``, off in the
    presets) takes longer than without them."""
    train = dict(BASE["train"], precision="fp8", fp8_recipe="delayed")
    with_pad = simulate(load_config(dict(BASE, train=dict(train, stack=dict(preset="megatron-te",
                                                                            fp8_expert_padding_copies=True)))))
    without = simulate(load_config(dict(BASE, train=dict(train, stack="megatron-te"))))
    assert with_pad.step_time_s > without.step_time_s


def test_router_and_permutation_index_kernels() -> None:
    """Fused router (TE): top-k, the aux loss's scores, tokens per expert and the loss in forward; four
    kernels in backward; the permutation's row map in three passes plus the tokens-per-expert count;
    the second permutation's sort maps in forward only. Bytes in closed form from T x E."""
    run = load_config(BASE)
    b = build_block(run.model, run.layout, run.train)
    te = b.T * 8
    fwd, bwd = _by_name(_kernels([], False)), _by_name(_kernels([], True))
    assert fwd["router.topk"] == [3 * ROUTER_BYTES * te]
    assert fwd["router.aux_scores"] == [2 * ROUTER_BYTES * te]
    assert fwd["router.tokens_per_expert"] == [te]
    assert fwd["router.aux_loss"] == [ROUTER_BYTES * te]
    assert fwd["moe.tokens_per_expert"] == [te]
    assert fwd["moe.row_id_map"] == [te + SORT_MAP_BYTES * te, 2 * SORT_MAP_BYTES * te, 2 * SORT_MAP_BYTES * te]
    assert "expert.sort_map" not in fwd  # one local expert: nothing to sort
    qwen = ["model=qwen3-30b-a3b", "layout.ep=8"]  # 16 local experts, top-8
    run = load_config(BASE, qwen)
    t = build_block(run.model, run.layout, run.train).T
    # one int32 per received copy (k x T), for the sort and the unsort
    assert _by_name(_kernels(qwen, False))["expert.sort_map"] == [SORT_MAP_BYTES * t * 8] * 2
    assert {n for n in bwd if n.startswith("router.")} == {"router.aux_loss.bwd", "router.aux_scores.bwd",
                                                          "router.topk.bwd", "router.grad_sum"}
    assert "expert.sort_map" not in bwd and "moe.row_id_map" not in bwd


def _comms(run_overrides: list[str], backward: bool) -> list[Comm]:
    run = load_config(BASE, run_overrides)
    b = build_block(run.model, run.layout, run.train)
    moe = run.model.moe_component()
    return [s for s in (b.moe_backward(moe) if backward else b.moe_forward(moe)) if isinstance(s, Comm)]


def test_token_counts_are_gathered_over_ep_before_an_all_to_all_dispatch() -> None:
    """The all-to-all dispatcher all-gathers its int64 tokens-per-expert counts over the EP group once per
    forward, after counting them and before the permutation's row maps (Megatron-core
    ``MoEAlltoAllTokenDispatcher.preprocess``): 8 experts x 8 bytes from each of the 8 EP ranks. None in
    backward, none with DeepEP (it counts inside its kernels), none without EP."""
    fwd = _comms([], False)
    gathers = [c for c in fwd if c.coll == ALL_GATHER and c.axis == "ep"]
    assert [c.size_bytes for c in gathers] == [COUNT_BYTES * 8 * 8] and COUNT_BYTES == 8.0
    assert fwd.index(gathers[0]) == 0  # before the dispatch's all-to-all
    run = load_config(BASE)
    segs = build_block(run.model, run.layout, run.train).moe_forward(run.model.moe_component())
    before, after = segs[segs.index(gathers[0]) - 1], segs[segs.index(gathers[0]) + 1]
    assert isinstance(before, tuple) and before[-1].name == "moe.tokens_per_expert"
    assert isinstance(after, tuple) and after[0].name == "moe.row_id_map" and after[-1].name == "moe.permute"
    assert not [c for c in _comms([], True) if c.coll == ALL_GATHER]
    assert not [c for c in _comms(["layout.ep_dispatcher=deepep"], False) if c.coll == ALL_GATHER]
    assert not [c for c in _comms(["layout.ep=1"], False) if c.coll == ALL_GATHER]


def test_the_count_exchange_slows_an_all_to_all_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the same run with the exchange taken out is faster. This toy step is bound by the host:
    each exchange costs about its ``torch.distributed`` call's CPU time (``C10D_COLLECTIVE_CPU_S``), issued
    right before the MoE's host sync, plus a small-message NCCL latency; 4 MoE layers x 2 micro-batches."""
    with_exchange = simulate(load_config(BASE)).step_time_s
    monkeypatch.setattr(MoEKernels, "_count_exchange", lambda self, c: [])
    without = simulate(load_config(BASE)).step_time_s
    assert 0.0 < with_exchange - without <= 4 * 2 * (C10D_COLLECTIVE_CPU_S + 20e-6)


def test_routing_probabilities_travel_in_their_own_all_to_all_on_megatron_core_0_13() -> None:
    """Megatron-core 0.13 and later (stack ``moe.probs_all_to_all``: megatron-te) send each routed copy's fp32
    probability in a second all-to-all right after the tokens', and its gradient back right before the
    tokens' gradient all-to-all; 2 copies (top-2) of each of the rank's T tokens, 4 bytes each. The
    Megatron-core of 2024 (megatron-te-2024, megatron-core), torchtitan and DeepEP send none."""
    run = load_config(BASE)
    t = build_block(run.model, run.layout, run.train).T
    fwd = [c for c in _comms([], False) if c.axis == "ep" and c.coll != ALL_GATHER]
    bwd = [c for c in _comms([], True) if c.axis == "ep"]
    # forward: tokens, probabilities, combine; backward: combine's gradient, probabilities', tokens'
    assert [c.size_bytes for c in fwd][1] == [c.size_bytes for c in bwd][1] == ROUTER_BYTES * t * 2
    assert len(fwd) == len(bwd) == 3 and fwd[0].size_bytes == fwd[2].size_bytes > fwd[1].size_bytes
    for other in (["train.stack=megatron-te-2024"], ["train.stack=megatron-core"], ["train.stack=torchtitan-compile"],
                  ["layout.ep_dispatcher=deepep"]):
        assert len([c for c in _comms(other, False) if c.axis == "ep" and c.coll != ALL_GATHER]) == 2, other
        assert len([c for c in _comms(other, True) if c.axis == "ep"]) == 2, other


def test_one_router_kernel_costed_by_hand() -> None:
    """A router kernel is memory-bound: its bytes at the HBM rate a memory op reaches, plus the launch
    tail (fused: one kernel under the Megatron stack)."""
    run = load_config(BASE, ["train.stack=megatron-te"])
    gpu = load_gpu("h100-sxm")
    cost = ComputeCostModel(gpu, "bf16", stack=run.train.stack_spec)
    te = 4096.0 * 128
    got = cost.kernel(MemoryBound("router.aux_scores", 2 * ROUTER_BYTES * te)).time_s
    assert got == pytest.approx(2 * ROUTER_BYTES * te / (gpu.hbm_Bps * gpu.memory_op_efficiency)
                                + gpu.kernel_launch_s, rel=1e-12)
