"""Context parallelism: ring attention overlap, all-gather and all-to-all variants, memory split by cp."""

from __future__ import annotations

import pytest

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.lower.blocks import Ring
from simtrain.lower.ops import ComputeOp
from simtrain.plan.load import load_config
from simtrain.studies.simulate import simulate

BASE = dict(model="llama3-8b", hardware=dict(node="dgx-h100", n_nodes=2),
            layout=dict(tp=8, cp=2, sequence_parallel=True, zero_stage=1),
            train=dict(seq_len=32768, global_batch_seqs=2))


def _exposed_cp(overrides: list[str]) -> tuple[float, float]:
    r = simulate(BASE, overrides)
    return r.breakdown_s["exposed_comm"]["cp"], r.step_time_s


def test_ring_exchange_hidden_when_shorter_than_attention_block() -> None:
    # 32k tokens, cp=2 over two nodes: a 16k x 16k causal block of 4 heads takes ~ms, its 2 MiB KV
    # block ~50 us on a 400 Gb/s NIC, so the ring hides the exchange completely.
    exposed, step = _exposed_cp([])
    assert exposed == pytest.approx(0.0, abs=1e-9)
    assert step > 0


def test_ring_exchange_exposed_when_longer_than_attention_block() -> None:
    # Short blocks (1k tokens per rank) and a 10 Gb/s NIC: each KV hop is far longer than its block.
    exposed, step = _exposed_cp(["train.seq_len=2048", "hardware.nic_Gbps=10", "train.global_batch_seqs=8"])
    assert exposed > 0.05 * step


@pytest.mark.parametrize("kind", ["p2p", "all_gather", "a2a"])
def test_attention_work_per_rank_is_one_cp_th(kind: str) -> None:
    """Causal load balancing: every CP rank does 1/cp of the attention FLOPs of the cp=1 run."""
    def attention_flops(cp: int) -> float:
        run = load_config(BASE, [f"layout.cp={cp}", f"layout.cp_comm={kind}", "hardware.n_nodes=" + str(cp)])
        low = lower(run, ComputeCostModel(load_gpu("h100-sxm"), "bf16"))
        ops = [o for o in low.programs[0].ops if isinstance(o, ComputeOp) and o.kernels]
        return sum(k.flops for o in ops for k in o.kernels if k.name.startswith("flash_attn"))
    assert attention_flops(4) == pytest.approx(attention_flops(1) / 4, rel=1e-9)


def test_ring_has_cp_steps() -> None:
    run = load_config(BASE, ["layout.cp=4", "hardware.n_nodes=4"])
    from simtrain.lower.blocks import BlockBuilder
    b = BlockBuilder(run.model, 1, 8192, 8, True, True, False, 4, "p2p")
    rings = [s for s in b.layer_forward() if isinstance(s, Ring)]
    assert len(rings) == 1 and rings[0].steps == 4 and rings[0].comm.axis == "cp"
    assert rings[0].comm.size_bytes == pytest.approx(2 * 2 * 8192 * (8 // 8) * 128)  # K and V, bf16
    back = [s for s in b.layer_backward() if isinstance(s, Ring)]
    assert back[0].comm.size_bytes == pytest.approx(2 * rings[0].comm.size_bytes)  # KV and dKV


def test_cp_divides_activation_memory() -> None:
    one = simulate(BASE, ["layout.cp=1", "hardware.n_nodes=1"])
    two = simulate(BASE, ["layout.zero_stage=0"])
    one0 = simulate(BASE, ["layout.cp=1", "hardware.n_nodes=1", "layout.zero_stage=0"])
    act1 = one0.memory[0].components["activations"]
    act2 = two.memory[0].components["activations"]
    assert act2 == pytest.approx(act1 / 2, rel=0.02)
    assert one.step_time_s > 0


def test_ring_needs_two_chunks_per_rank() -> None:
    from simtrain.spec.errors import ConfigError
    with pytest.raises(ConfigError, match="layout.cp"):
        load_config(BASE, ["train.seq_len=4098"])


def test_ring_step_merges_its_partial_result() -> None:
    """Each ring step merges its partial into the running result: 10 bytes per element fused (TE), over
    the local queries' output in forward and dQ, dK, dV in backward, (1 + 0.75 (cp - 1)) / cp of them on
    the mean step (load-balanced causal halves); torch's eager merge moves 3.4x the bytes in 5 kernels."""
    from simtrain.lower.blocks import BlockBuilder
    from simtrain.spec.stacks import get_stack

    run = load_config(BASE, ["layout.cp=4", "hardware.n_nodes=4"])
    m, gpu = run.model, load_gpu("h100-sxm")
    share = (1 + 0.75 * 3) / 4
    merges = {}
    for stack in ("megatron-te", "torchtitan-compile"):
        cost = ComputeCostModel(gpu, "bf16", stack=get_stack(stack))
        b = BlockBuilder(m, 1, 8192, 8, True, True, False, 4, "p2p")
        fwd = cost.kernel([s for s in b.layer_forward() if isinstance(s, Ring)][0].kernels[-1])
        bwd = cost.kernel([s for s in b.layer_backward() if isinstance(s, Ring)][0].kernels[-1])
        merges[stack] = (fwd, bwd)
    fwd, bwd = merges["megatron-te"]
    heads, kv_heads = m.n_heads // 8, m.kv_heads // 8
    assert fwd.name == "cp_merge" and fwd.bytes == pytest.approx(10 * share * 8192 * heads * m.v_head_dim)
    assert bwd.bytes == pytest.approx(10 * share * 8192 * (heads + 2 * kv_heads) * m.d_head)
    eager = merges["torchtitan-compile"][0]
    assert eager.bytes == pytest.approx(3.4 * fwd.bytes)
    assert eager.time_s > 3 * fwd.time_s


def test_torch_ring_attention_gathers_expanded_kv_once_and_rings_fp32_grads() -> None:
    """torch's context_parallel (default ALL_GATHER rotation, convert_to_f32): forward and backward each
    all-gather the head-expanded K and V beside the first block; backward passes fp32 dK, dV around the
    ring; every step concatenates what it holds."""
    from simtrain.lower.blocks import BlockBuilder, Comm

    run = load_config(BASE, ["layout.cp=4", "hardware.n_nodes=4"])
    m = run.model
    b = BlockBuilder(m, 1, 8192, 8, True, True, False, 4, "p2p", torch_cp=True)
    heads = m.n_heads // 8  # K and V expanded to the query heads
    kv = 2 * 8192 * heads * m.d_head
    fwd = [s for s in b.layer_forward() if isinstance(s, Comm | Ring) and getattr(s, "axis", "cp") == "cp"]
    gather, ring = fwd[0], fwd[1]
    assert isinstance(gather, Comm) and gather.coll.kind == "all_gather" and gather.overlap
    assert gather.size_bytes == pytest.approx(2 * kv * 4)
    assert isinstance(ring, Ring) and ring.steps == 4 and ring.comm is None
    assert [k.name for k in ring.kernels] == ["flash_attn.fwd", "cp_merge", "cp_cat"]
    back = [s for s in b.layer_backward() if isinstance(s, Ring)][0]
    assert back.comm is not None and back.comm.size_bytes == pytest.approx(4 * kv)  # fp32 dK + dV
    # the engine and the search estimate both price it above TE's KV ring, and agree within 15 % (the
    # estimate is 11 % below the engine for this CP-across-nodes layout with TE's ring already)
    from simtrain.studies.estimate import Estimator
    from simtrain.studies.simulate import cluster_of

    times = {}
    for stack in ("torchtitan-compile", "megatron-te"):
        run = load_config(BASE, ["layout.cp=4", "hardware.n_nodes=4", f"train.stack={stack}"])
        est = Estimator(run.model, cluster_of(run)).estimate(run.layout, run.train).step_time_s
        times[stack] = (est, simulate(run).step_time_s)
    est, sim = times["torchtitan-compile"]
    assert est == pytest.approx(sim, rel=0.15)
    assert est > times["megatron-te"][0] and sim > times["megatron-te"][1]


def test_torch_ring_backward_buffers_closed_form() -> None:
    """torch's ring backward holds the all-gathered expanded K, V (2 bytes x cp x K and V), a bf16
    concatenation, three fp32 dK, dV buffers and two steps' bf16 grads per K/V element; per query
    element fp32 dQ, two steps' bf16 dQ and the flash fp32 accumulator; nothing at cp = 1."""
    from simtrain.lower.memory import ActivationShape, torch_cp_backward_transient_bytes

    m = load_config(BASE).model
    a = ActivationShape(b=1, s=8192, t=8, sp=True, flash=True, dropout=False)
    q = 8192 * m.n_heads * m.d_head / 8
    kv = 2 * q  # K and V expanded to the query heads, d_v = d_qk
    assert torch_cp_backward_transient_bytes(m, a, 1) == 0.0
    assert torch_cp_backward_transient_bytes(m, a, 4) == pytest.approx((2 * 4 + 18) * kv + 12 * q)
    # each doubling of cp adds one more gathered copy of every rank's K and V
    step = torch_cp_backward_transient_bytes(m, a, 8) - torch_cp_backward_transient_bytes(m, a, 4)
    assert step == pytest.approx(2 * 4 * kv)


def test_torch_ring_buffers_raise_the_peak_only_with_torch_cp() -> None:
    """Long context on torchtitan: the ring backward's buffers outgrow the MLP gradients, so the peak
    grows with cp at a fixed per-rank token count by the gathered K and V; the engine's peak and the
    closed form agree; Megatron/TE's ring (not modelled by these buffers) does not move."""
    # pp = 2: the first stage holds no LM head, so its peak is a layer's backward, not the loss's
    base = dict(model="llama3-70b", hardware=dict(node="dgx-h100", n_nodes=16),
                layout=dict(tp=8, cp=8, pp=2, sequence_parallel=True, zero_stage=3, recompute="full"),
                train=dict(seq_len=262144, global_batch_seqs=2, stack="torchtitan-compile"))
    peaks = {}
    for cp in (4, 8):
        r = simulate(base, [f"layout.cp={cp}", f"train.seq_len={cp * 32768}", f"hardware.n_nodes={2 * cp}"])
        mem = r.memory[0]
        assert mem.peak_bytes == pytest.approx(mem.closed_form_peak_bytes, rel=0.01)
        peaks[cp] = mem.components["activations"]
    m = load_config(base).model
    kv_per_cp = 2 * 2 * 32768 * (m.n_heads // 8) * m.d_head  # bf16 K and V of one rank's shard
    assert peaks[8] - peaks[4] == pytest.approx(4 * kv_per_cp, rel=0.01)
    te = [simulate(base, [f"layout.cp={cp}", f"train.seq_len={cp * 32768}", f"hardware.n_nodes={2 * cp}",
                          "train.stack=megatron-te"]).memory[0].components["activations"] for cp in (4, 8)]
    assert te[1] == pytest.approx(te[0], rel=1e-6)
