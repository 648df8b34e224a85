"""Mixture of experts with expert parallelism: all-to-all cost, expert compute, routing skew, memory."""

from __future__ import annotations

import pytest

from simtrain.cost.collectives import effective_bandwidth, plan_collective
from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import build_cluster, load_gpu
from simtrain.hardware.topology import Topology
from simtrain.lower.memory import activation_shape, moe_mlp_activation_bytes
from simtrain.lower.ops import CommOp, ComputeOp
from simtrain.plan.load import load_config
from simtrain.plan.routing import expert_loads, worst_rank_load
from simtrain.spec.collective_kinds import ALL_TO_ALL, Collective, CollectiveKind, NodeLimited
from simtrain.studies.simulate import simulate

# a shrunk Mixtral: 4 layers, 8 experts top-2, h=1024
SMALL_MOE = dict(name="moe-small", n_layers=4, hidden=1024, n_heads=8, n_kv_heads=4, ffn_hidden=2048,
                 activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False,
                 linear_bias=False, moe=dict(n_experts=8, top_k=2, ffn_hidden=2048))
BASE = dict(model=SMALL_MOE, hardware=dict(n_nodes=1), layout=dict(dp=8, ep=8),
            train=dict(seq_len=2048, global_batch_seqs=16))


def test_all_to_all_in_one_nvlink_node_is_closed_form() -> None:
    """(p-1)/p * S / B + latency for S bytes per GPU on p GPUs of one NVSwitch node (reference Table B)."""
    cluster = build_cluster("dgx-h100", 1)
    topo, gpu = Topology(cluster), cluster.gpu
    S = 256 * 2**20
    plan = plan_collective("all_to_all", tuple(range(8)), S, topo, gpu)
    bw = effective_bandwidth(topo, gpu, ("gpu0", "nvsw0"))
    assert plan.estimate_s == pytest.approx(plan.latency_s + 7 / 8 * S / bw, rel=1e-9)


def test_all_to_all_across_nodes_is_bound_by_one_nic_per_gpu() -> None:
    """16 GPUs on 2 nodes: each GPU sends half its buffer off-node through its own NIC."""
    cluster = build_cluster("dgx-h100", 2)
    topo, gpu = Topology(cluster), cluster.gpu
    S = 256 * 2**20
    plan = plan_collective("all_to_all", tuple(range(16)), S, topo, gpu)
    nic = effective_bandwidth(topo, gpu, ("nic0.0", "leaf0.0"))
    assert plan.estimate_s == pytest.approx(plan.latency_s + 8 / 16 * S / nic, rel=1e-6)


def _expert_flops_per_rank(cfg: dict) -> float:
    run = load_config(cfg)
    low = lower(run, ComputeCostModel(load_gpu("h100-sxm"), "bf16"))
    return sum(k.flops for o in low.programs[0].ops if isinstance(o, ComputeOp) for k in o.kernels
               if k.name.startswith("expert."))


def test_balanced_expert_compute_per_gpu_is_active_flops_over_gpus() -> None:
    """Routed-expert hardware FLOPs of one rank = every token's top-k expert FLOPs (fwd 2, bwd 4 per
    parameter) / GPUs, for every EP degree."""
    run = load_config(BASE)
    m = run.model
    tokens = 16 * 2048
    n_gpus = 8
    per_token = 6.0 * m.moe.top_k * m.expert_params() * m.n_layers  # type: ignore[union-attr]
    for ep in (1, 2, 4, 8):
        got = _expert_flops_per_rank(dict(BASE, layout=dict(dp=8, ep=ep)))
        assert got == pytest.approx(per_token * tokens / n_gpus, rel=1e-9), ep


def test_hot_expert_sets_the_pace_in_both_modes() -> None:
    steps = {}
    for hot in (1.0, 2.0, 4.0):
        over = ["train.moe_routing=skewed", f"train.moe_hot_expert_load={hot}"]
        sym, full = simulate(BASE, over, mode="symmetric"), simulate(BASE, over, mode="full")
        steps[hot] = (sym.step_time_s, full.step_time_s)
        assert full.step_time_s == pytest.approx(sym.step_time_s, rel=0.02)
    assert steps[1.0][0] < steps[2.0][0] < steps[4.0][0]
    assert steps[1.0][1] < steps[2.0][1] < steps[4.0][1]


def test_hot_rank_load_is_the_mean_of_its_experts() -> None:
    """8 experts on 8 EP ranks, one hot at 4x the mean: rank 0 gets 4x, the others (8 - 4) / 7 each; on 4
    ranks (2 experts each) rank 0 gets (4 + 4/7) / 2; a capacity factor of 1.25 caps it at 1.25."""
    run = load_config(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4"])
    assert worst_rank_load(run.model, run.train, run.layout) == pytest.approx(4.0)
    four = load_config(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4", "layout.ep=4"])
    assert worst_rank_load(four.model, four.train, four.layout) == pytest.approx((4 + 4 / 7) / 2)
    capped = load_config(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4", "train.moe_capacity_factor=1.25"])
    assert worst_rank_load(capped.model, capped.train, capped.layout) == pytest.approx(1.25)
    balanced = load_config(BASE)
    assert worst_rank_load(balanced.model, balanced.train, balanced.layout) == 1.0


def _ep_bytes(cfg: dict, over: list[str]) -> float:
    run = load_config(cfg, over)
    cost = ComputeCostModel(load_gpu("h100-sxm"), run.train.precision)
    return sum(op.comm_bytes for op in lower(run, cost).programs[0].ops
               if isinstance(op, CommOp) and op.axis == "ep" and op.coll is not None
               and op.coll.kind == CollectiveKind.ALL_TO_ALL)


def test_all_to_alls_carry_the_hot_ranks_tokens() -> None:
    """An all-to-all ends when the busiest link has moved its bytes: the hot rank receives (dispatch) and
    sends back (combine) 4x the balanced copies, so every EP all-to-all is sized 4x (the count exchange's
    all-gather before the dispatch is not: it carries one count per expert whatever the load)."""
    skew = ["train.moe_routing=skewed", "train.moe_hot_expert_load=4"]
    assert _ep_bytes(BASE, skew) == pytest.approx(4.0 * _ep_bytes(BASE, []), rel=1e-12)
    balanced, hot = simulate(BASE), simulate(BASE, skew)
    assert hot.breakdown_s["exposed_comm"]["ep"] > balanced.breakdown_s["exposed_comm"]["ep"]


def test_hot_rank_keeps_more_expert_activations() -> None:
    """The peak is the busiest rank's: its routed experts keep load x the balanced activations (the
    permuted inputs and expert intermediates of tokens x top_k copies); the closed form agrees."""
    run = load_config(BASE)
    balanced_shape = activation_shape(run.train, run.layout, run.model)
    hot_run = load_config(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4"])
    hot_shape = activation_shape(hot_run.train, hot_run.layout, hot_run.model)
    assert hot_shape.expert_load == pytest.approx(4.0)
    m, a = run.model, balanced_shape
    moe = m.moe
    assert moe is not None
    routed = a.tokens * moe.top_k * (2.0 * m.hidden + 3 * 2.0 * moe.ffn_hidden)
    assert moe_mlp_activation_bytes(m, hot_shape) - moe_mlp_activation_bytes(m, a) == pytest.approx(3.0 * routed)
    balanced, hot = simulate(BASE), simulate(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4"])
    for r in (balanced, hot):
        assert r.memory[0].peak_bytes == pytest.approx(r.memory[0].closed_form_peak_bytes, rel=1e-9)
    assert hot.memory[0].components["activations"] > balanced.memory[0].components["activations"] + 2.0 * routed


def test_capacity_factor_caps_the_hot_expert() -> None:
    assert expert_loads(8, "skewed", 4.0, None)[0] == 4.0
    assert expert_loads(8, "skewed", 4.0, 1.25)[0] == 1.25
    assert sum(expert_loads(8, "skewed", 4.0, None)) == pytest.approx(8.0)
    capped = simulate(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4", "train.moe_capacity_factor=1.25"])
    hot = simulate(BASE, ["train.moe_routing=skewed", "train.moe_hot_expert_load=4"])
    assert capped.step_time_s < hot.step_time_s


def test_symmetric_equals_full_balanced() -> None:
    for layout in (dict(dp=8, ep=8), dict(dp=4, tp=2, ep=4, etp=1, sequence_parallel=True),
                   dict(dp=4, pp=2, ep=2, zero_stage=1)):
        cfg = dict(BASE, layout=layout)
        sym, full = simulate(cfg, mode="symmetric"), simulate(cfg, mode="full")
        assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.01), layout


def test_experts_are_sharded_by_ep() -> None:
    """Weights on a rank: dense part everywhere, routed experts divided by ep."""
    run = load_config(BASE)
    m = run.model
    experts = m.routed_expert_param_count()
    w = {ep: simulate(dict(BASE, layout=dict(dp=8, ep=ep))).memory[0].components["weights"] for ep in (1, 8)}
    assert w[1] - w[8] == pytest.approx(2.0 * experts * (1 - 1 / 8), rel=1e-6)


def test_dispatch_combine_show_up_as_exposed_ep() -> None:
    r = simulate(dict(BASE, hardware=dict(n_nodes=2), layout=dict(dp=16, ep=8, etp=1)), ["train.global_batch_seqs=32",
                                                                                     "layout.order=[dp,tp,cp,ep,pp]"])
    assert r.breakdown_s["exposed_comm"]["ep"] > 0


def test_moe_config_errors() -> None:
    from simtrain.spec.errors import ConfigError
    with pytest.raises(ConfigError, match="layout.ep"):
        load_config(BASE, ["layout.ep=3"])
    with pytest.raises(ConfigError, match="sequence_parallel"):
        load_config(BASE, ["layout.tp=2", "layout.dp=4", "layout.ep=4"])


def test_node_limited_all_to_all_crosses_the_network_once_per_node() -> None:
    """DeepSeek-V3 group-limited routing over 8 nodes, at most 4 per token, top-8: each GPU sends
    size/8 x 4/8 to each of 7 remote rail peers through its NIC (half the bytes of a plain all-to-all)."""
    cluster = build_cluster("hgx-h800", 8)
    topo, gpu = Topology(cluster), cluster.gpu
    S = 256 * 2**20
    gpus = tuple(range(64))
    limited = plan_collective(Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(4, 8, 256)), gpus, S, topo, gpu)
    plain = plan_collective("all_to_all", gpus, S, topo, gpu)
    nic = effective_bandwidth(topo, gpu, ("nic0.0", "leaf0.0"))
    assert limited.estimate_s == pytest.approx(limited.latency_s + 7 * S / 8 * 4 / 8 / nic, rel=1e-6)
    assert plain.estimate_s - plain.latency_s == pytest.approx(2 * (limited.estimate_s - limited.latency_s),
                                                               rel=1e-6)


def test_deepseek_v3_routes_to_at_most_four_nodes() -> None:
    from simtrain.spec.model import preset
    moe = preset("deepseek-v3").moe
    assert moe is not None and moe.group_limited and (moe.n_group, moe.topk_group) == (8, 4)


def test_zero3_reduces_and_gathers_expert_weights_over_expert_data_parallel() -> None:
    """FSDP/ZeRO-3 with experts: expert gradients are reduce-scattered (and weights gathered) over the
    expert-data-parallel group, so ZeRO-3 costs more DP traffic than ZeRO-1 would leave out."""
    run = load_config(BASE, ["layout.ep=4", "layout.zero_stage=3"])
    low = lower(run, ComputeCostModel(load_gpu("h100-sxm"), "bf16"))
    axes = {o.axis for o in low.programs[0].ops if isinstance(o, CommOp) and o.name.startswith("fsdp.")}
    assert "edp" in axes and "dp" in axes
    sym, full = simulate(BASE, ["layout.ep=4", "layout.zero_stage=3"], mode="symmetric"), \
        simulate(BASE, ["layout.ep=4", "layout.zero_stage=3"], mode="full")
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=0.01)


def test_routed_experts_wait_for_the_overlapped_dispatch() -> None:
    """With the dispatch overlapped (``ep_comm_overlap``, DualPipe), only the shared experts run beside
    the all-to-all; the routed experts need the tokens it delivers, so they are a separate segment the
    engine starts after it (a merged segment would let them run before their tokens arrive)."""
    from simtrain.lower.blocks import Comm
    from simtrain.lower.layer_plan import build_block

    run = load_config(dict(model="deepseek-v3", hardware=dict(n_nodes=8),
                           layout=dict(ep=64, dp=64, ep_comm_overlap=True),
                           train=dict(seq_len=4096, global_batch_seqs=64)))
    block = build_block(run.model, run.layout, run.train)
    layer = next(i for i in range(run.model.n_layers) if run.model.is_moe_layer(i))
    for segs in (block.layer_forward(layer), block.layer_backward(layer)):
        i = next(i for i, s in enumerate(segs) if isinstance(s, Comm) and s.axis == "ep" and s.overlap)
        beside, after = segs[i + 1], segs[i + 2]
        assert isinstance(beside, tuple) and all(k.name.startswith("shared.") for k in beside)
        assert isinstance(after, tuple) and after[0].name.startswith("expert.")


def test_node_hit_probability_closed_forms() -> None:
    from math import comb

    from simtrain.cost.collectives import node_hit_probability
    # Qwen3-30B-A3B's 128 experts over 2 nodes, top-8: a token misses a node only if all 8 are elsewhere
    assert node_hit_probability(2, 8, 128) == pytest.approx(1 - comb(64, 8) / comb(128, 8))
    assert node_hit_probability(8, 8, 256, m_nodes=4) == 0.5  # DeepSeek-V3: at most 4 of 8 nodes
    assert node_hit_probability(64, 1, 64) == pytest.approx(1 / 64)  # top-1: the expert's own node
    assert 0 < node_hit_probability(4, 2, 16) < 2 / 4  # two experts may share a node


def test_deepep_dispatch_crosses_the_network_once_per_remote_node() -> None:
    """EP16 over two H100 nodes, top-8 of 128 experts: a plain all-to-all sends half of each GPU's k
    copies (size/2) through its NIC, DeepEP one copy per token (size/8) to the rail peer, which forwards
    over NVLink: the network part is 4x shorter, divided by the chance a token hits the other node."""
    from simtrain.cost.collectives import node_hit_probability
    cluster = build_cluster("dgx-h100", 2)
    topo, gpu = Topology(cluster), cluster.gpu
    S, gpus = 64 * 2**20, tuple(range(16))
    plain = plan_collective("all_to_all", gpus, S, topo, gpu)
    dedup = plan_collective(Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(0, 8, 128)), gpus, S, topo, gpu)
    nic = effective_bandwidth(topo, gpu, ("nic0.0", "leaf0.0"))
    assert dedup.estimate_s - dedup.latency_s == pytest.approx(S / 8 * node_hit_probability(2, 8, 128) / nic, rel=1e-6)
    assert (plain.estimate_s - plain.latency_s) / (dedup.estimate_s - dedup.latency_s) == pytest.approx(4, rel=0.02)


@pytest.mark.parametrize(("model", "dispatcher", "coll"), [
    ("deepseek-v3", "auto", Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(4, 8, 256))),  # trains with DeepEP
    ("deepseek-v3", "alltoall", ALL_TO_ALL),
    ("qwen3-30b-a3b", "auto", ALL_TO_ALL),
    ("qwen3-30b-a3b", "deepep", Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(0, 8, 128))),
])
def test_ep_dispatcher_picks_the_dispatch_collective(model: str, dispatcher: str, coll: Collective) -> None:
    from simtrain.lower.layer_plan import build_block
    run = load_config(BASE, [f"model={model}", "layout.ep=8", f"layout.ep_dispatcher={dispatcher}"])
    dispatch, combine, _ = build_block(run.model, run.layout, run.train)._moe_comms(run.model.moe_component())
    assert dispatch.coll == combine.coll == coll


def test_alltoall_dispatcher_sorts_received_tokens_by_local_expert() -> None:
    """Megatron's second permutation (sort_chunks_by_idxs): with several local experts the all-to-all
    dispatcher reads and writes the k x tokens received copies once after the dispatch and once before
    the combine, and their gradients in backward; DeepEP lands them in expert order, one expert needs no sort."""
    from simtrain.lower.layer_plan import build_block

    def sorts(*overrides: str) -> dict[str, float]:
        run = load_config(BASE, ["model=qwen3-30b-a3b", *overrides])
        b = build_block(run.model, run.layout, run.train)
        moe = run.model.moe_component()
        ks = [k for seg in (*b.moe_forward(moe), *b.moe_backward(moe)) if isinstance(seg, tuple) for k in seg]
        return {k.name: k.bytes for k in ks if "sort_chunks" in k.name}

    run = load_config(BASE, ["model=qwen3-30b-a3b", "layout.ep=8"])
    b = build_block(run.model, run.layout, run.train)
    copies = b.T * 8 * run.model.hidden  # balanced routing: this rank receives k copies of T tokens
    got = sorts("layout.ep=8")
    assert set(got) == {"expert.sort_chunks", "expert.unsort_chunks", "expert.sort_chunks.bwd",
                        "expert.unsort_chunks.bwd"}
    assert all(v == pytest.approx(2 * 2.0 * copies) for v in got.values())
    assert sorts("layout.ep=8", "layout.ep_dispatcher=deepep") == {}
    assert sorts("layout.ep=1") == {}
