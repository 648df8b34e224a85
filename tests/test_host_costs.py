"""The host side of a step (simtrain.cost.host): the CPU running ahead of the GPU, host syncs, CUDA graphs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from simtrain.cost.host import (
    C10D_COLLECTIVE_CPU_S,
    GRACE_HOST_FACTOR,
    GRACE_HOSTED_GPUS,
    HOST_SYNC_S,
    HostModel,
    RunAhead,
    add_host_gaps,
    host_model,
    run_segment,
    segment,
    segments,
    steady_host_gaps,
)
from simtrain.engine.critical_path import evaluate
from simtrain.engine.engine import Engine
from simtrain.hardware.load import build_cluster, load_gpu
from simtrain.hardware.topology import Topology
from simtrain.lower.ops import CollectiveOp, CostedComputeOp, Kernel, OpKind, Program, SendOp, Stream
from simtrain.plan.layout import RankGrid
from simtrain.spec.collective_kinds import ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SEND
from simtrain.spec.config import LayoutConfig
from simtrain.spec.stacks import MEGATRON_CPU_LAUNCH_S, STACKS
from simtrain.studies.simulate import simulate

US = 1e-6


def _op(idx: int, kernels: tuple[Kernel, ...], category: str = "fwd") -> CostedComputeOp:
    total = sum(k.time_s for k in kernels)
    return CostedComputeOp(idx, Stream.COMPUTE, f"op{idx}", category, kernels=kernels, duration_s=total)


def _k(name: str, time_s: float, launches: int = 1) -> Kernel:
    return Kernel(name, 0.0, 0.0, time_s, launches=launches)


# -- closed forms -------------------------------------------------------------------------------------

def test_one_kernel_from_an_empty_queue_waits_for_its_own_issue() -> None:
    # the GPU can start it only once the CPU has issued it: c + g, not max(c, g)
    stall, backlog = run_segment(segment([100 * US], [8 * US]), 0.0, HOST_SYNC_S)
    assert stall == pytest.approx(8 * US)
    assert backlog == pytest.approx(100 * US)  # the GPU ends 100 us after the CPU has issued it


def test_the_cpu_running_ahead_hides_short_kernels_behind_a_long_one() -> None:
    # one 100 us GEMM then ten 2 us kernels at 8 us of CPU each: D = max_j (C_j - G_<j) = 8 us (the first);
    # kernel j >= 2 is issued at 8 j us and the GPU reaches it at 8 + 100 + 2 (j - 2) us: never starved
    seg = segment([100 * US] + [2 * US] * 10, [8 * US] * 11)
    assert seg.lead_s == pytest.approx(8 * US)
    assert run_segment(seg, 0.0, 0.0)[0] == pytest.approx(8 * US)
    # the per-kernel floor max(g, c) would have charged 10 x (8 - 2) = 60 us more
    assert run_segment(seg, 50 * US, 0.0)[0] == 0.0


def test_a_cpu_bound_sequence_runs_at_the_cpu_rate() -> None:
    # n kernels of 2 us GPU and 8 us CPU each, empty queue: the GPU ends at 8 n + 2, idle 8 n + 2 - 2 n
    n = 20
    stall, _ = run_segment(segment([2 * US] * n, [8 * US] * n), 0.0, 0.0)
    assert stall == pytest.approx((8 * n + 2 - 2 * n) * US)


def test_a_backlog_absorbs_the_issue_time() -> None:
    seg = segment([2 * US] * 20, [8 * US] * 20)
    stalls = [run_segment(seg, b * US, 0.0)[0] for b in (0, 10, 50, 200)]
    assert stalls == sorted(stalls, reverse=True)  # monotone in the backlog
    assert stalls[-1] == 0.0  # 200 us of queued GPU work covers 160 us of issue
    assert stalls[0] - stalls[1] == pytest.approx(10 * US)


def test_a_sync_drains_the_queue_and_the_next_kernel_waits_for_the_round_trip() -> None:
    model = HostModel(8 * US, frozenset({"moe.permute"}))
    ops = [_op(0, (_k("a", 1e-3),) * 3), _op(1, (_k("router", 50 * US), _k("moe.permute", 20 * US))),
           _op(2, (_k("expert.up", 1e-3),))]
    out = add_host_gaps(list(ops), model)
    gaps = [o.duration_s - i.duration_s for o, i in zip(out, ops, strict=True)]  # type: ignore[attr-defined]
    assert gaps[0] == pytest.approx(8 * US)  # step start: the first kernel waits for its issue
    assert gaps[1] == 0.0  # ~3 ms of queued work hides the router's issue
    assert gaps[2] == pytest.approx(HOST_SYNC_S + 8 * US)  # after the sync: round trip + issue


def test_the_optimizer_waits_for_the_gradient_norm() -> None:
    # four multi-tensor launches of 75 us each: the first waits for the round trip and its own issue
    ops = [_op(0, (_k("a", 1e-3),) * 3), _op(1, (_k("adam", 300 * US, launches=4),), "optimizer")]
    synced = add_host_gaps(list(ops), HostModel(8 * US, sync_before_optimizer=True))
    free = add_host_gaps(list(ops), HostModel(8 * US))
    assert synced[1].duration_s - ops[1].duration_s == pytest.approx(HOST_SYNC_S + 8 * US)  # type: ignore[attr-defined]
    assert free[1].duration_s == ops[1].duration_s  # type: ignore[attr-defined]


def test_segments_split_after_each_sync_kernel_and_count_launches() -> None:
    model = HostModel(4 * US, frozenset({"moe.permute"}))
    # an unfused norm: 7 kernels of 10/7 us GPU, 4 us CPU each: CPU-bound, its last part leads
    # (C = 28 us, G before it = 60/7 us); then the permute: C = 32 us, G before = 10 us
    segs = segments((_k("norm", 10 * US, launches=7), _k("moe.permute", 5 * US), _k("x", 1 * US)), model)
    assert [s.sync_after for s in segs] == [True, False]
    assert segs[0].cpu_s == pytest.approx(8 * 4 * US) and segs[0].gpu_s == pytest.approx(15 * US)
    assert segs[0].lead_s == pytest.approx(max(28 * US - 60 / 7 * US, 32 * US - 10 * US))
    # the same 7 kernels one by one give the same lead
    assert segment([10 / 7 * US] * 7, [4 * US] * 7).lead_s == pytest.approx(28 * US - 60 / 7 * US)


def test_a_collective_call_holds_the_cpu_and_after_a_sync_the_gpu_waits_for_it() -> None:
    """The MoE dispatch: after the token-count sync the CPU issues the all-to-all (c seconds of c10d) before
    the next kernel, so that kernel waits for the round trip, the call and its own issue; with queued work
    the call is absorbed (the backlog shrinks by c)."""
    c = 90 * US
    model = HostModel(8 * US, frozenset({"moe.permute"}), cpu_collective_s=c)
    a2a = CollectiveOp(2, Stream.EP, "ep.all_to_all", "comm", coll=ALL_TO_ALL, axis="ep", comm_bytes=1e6)
    ops = [_op(0, (_k("a", 1e-3),) * 3), _op(1, (_k("router", 50 * US), _k("moe.permute", 20 * US))), a2a,
           _op(3, (_k("expert.up", 1e-3),))]
    out = add_host_gaps(list(ops), model)
    assert out[2] is a2a
    assert out[3].duration_s - ops[3].duration_s == pytest.approx(HOST_SYNC_S + c + 8 * US)  # type: ignore[attr-defined]
    queued = [_op(0, (_k("a", 1e-3),) * 3), a2a, _op(2, (_k("b", 1e-3),))]
    free = add_host_gaps(list(queued), model)
    assert free[2].duration_s == queued[2].duration_s  # type: ignore[attr-defined]  # 3 ms queued covers 90 us
    # a send costs the same; a chunk of a collective fused with its GEMM (TP comm overlap) costs nothing
    send = SendOp(1, Stream.PP, "pp.send", "comm", coll=SEND, axis="pp", comm_bytes=1e6, peer_stage=1)
    fused = CollectiveOp(1, Stream.TP, "tp.reduce_scatter", "comm", coll=REDUCE_SCATTER, axis="tp", comm_bytes=1e6,
                         host_issued=False)
    first = _k("a", 1 * US)
    for comm, extra in ((send, c), (fused, 0.0)):
        got = add_host_gaps([_op(0, (first,)), comm, _op(2, (_k("b", 1 * US),))], model)
        # from an empty queue: a waits 8 us; b is issued at 16 us + the call, the GPU is free at 9 us
        assert got[2].duration_s - 1 * US == pytest.approx(8 * US + extra - 1 * US)  # type: ignore[attr-defined]


def test_a_repeated_pass_is_costed_from_the_steady_queue() -> None:
    """``steady_host_gaps``: a pass of kernels the step repeats. GPU-bound (each 10 us kernel issued in 8 us):
    from an empty queue the first kernel waits 8 us, in the steady state the queue is ahead and nothing waits,
    so the 8 us are paid once. CPU-bound (4 us kernels): each pass idles its CPU excess, 4 x (8 - 4) us, in
    the steady state; the first pass 4 us more (8 us before its first kernel, 3 x 4 after; in the steady
    state the previous pass's last kernel covers 4 us of that first issue). A collective call before the
    pass (the step's head) empties the queue by its CPU time."""
    model = HostModel(8 * US, cpu_collective_s=20 * US)
    for g, steady_stall, cold in ((10 * US, 0.0, 8 * US), (4 * US, 16 * US, 4 * US)):
        ops = [_op(i, (_k("a", g),)) for i in range(4)]
        got, extra = steady_host_gaps(list(ops), model, slice(0, None))
        assert sum(o.host_stall_s for o in got) == pytest.approx(steady_stall)  # type: ignore[attr-defined]
        assert extra == pytest.approx(cold)
    gathers = [CollectiveOp(i, Stream.DP_GATHER, "dp.all_gather", "comm", coll=REDUCE_SCATTER, axis="dp",
                            comm_bytes=1e6) for i in range(2)]
    ops = gathers + [_op(2 + i, (_k("a", 10 * US),)) for i in range(4)]
    got, extra = steady_host_gaps(list(ops), model, slice(2, None))
    assert got[:2] == gathers and all(o.host_stall_s == 0.0 for o in got[2:])  # type: ignore[attr-defined]
    assert extra == pytest.approx(2 * 20 * US + 8 * US)  # both calls, then the first kernel's issue
    assert steady_host_gaps(list(ops), None, slice(2, None)) == (ops, 0.0)


def test_without_cpu_cost_or_syncs_nothing_moves() -> None:
    ops = [_op(0, (_k("a", 1 * US),) * 5)]
    assert add_host_gaps(list(ops), HostModel(0.0)) == ops
    assert add_host_gaps(list(ops), None) == ops


# -- the stacks' values ----------------------------------------------------------------------------------

def test_megatron_issues_kernels_and_syncs_on_the_gradient_norm() -> None:
    for name in ("megatron-te", "megatron-core", "megatron-legacy"):
        model = host_model(STACKS[name], "h100")
        assert model is not None
        assert model.cpu_launch_s == MEGATRON_CPU_LAUNCH_S == 8 * US
        assert model.sync_before_optimizer and model.sync_after == frozenset({"moe.permute", "cross_entropy"})
    titan = host_model(STACKS["torchtitan-compile"], "h100")
    assert titan is not None and not titan.sync_before_optimizer


def test_a_grace_host_issues_slower_and_cuda_graphs_issue_nothing() -> None:
    stack = STACKS["megatron-te"]
    assert {load_gpu(n).name for n in ("gb200", "gb300")} == GRACE_HOSTED_GPUS
    assert host_model(stack, load_gpu("b200").name).cpu_launch_s == 8 * US  # type: ignore[union-attr]
    grace = host_model(stack, "gb200")
    assert grace is not None and grace.cpu_launch_s == pytest.approx(8 * US * GRACE_HOST_FACTOR)
    assert pytest.approx((33.17 / 13.48 + 37.08 / 13.48) / 2, abs=0.01) == GRACE_HOST_FACTOR
    assert grace.cpu_collective_s == pytest.approx(C10D_COLLECTIVE_CPU_S * GRACE_HOST_FACTOR)
    assert host_model(stack, "h100").cpu_collective_s == C10D_COLLECTIVE_CPU_S == 89 * US  # type: ignore[union-attr]
    graphed = host_model(stack.model_copy(update={"launch": stack.launch.model_copy(update={"cuda_graphs": True})}))
    assert graphed is not None and graphed.cpu_launch_s == 0.0 and graphed.sync_before_optimizer
    assert graphed.cpu_collective_s == 0.0


# -- end to end ------------------------------------------------------------------------------------------

MOE_TINY = dict(name="moe-tiny", n_layers=4, hidden=1024, n_heads=8, n_kv_heads=8, ffn_hidden=2816,
                activation="swiglu", norm="rmsnorm", position="rope", vocab=8192, tied_embeddings=False,
                linear_bias=False, moe=dict(n_experts=8, top_k=2, ffn_hidden=1024))


def _run(stack: Any, model: dict[str, Any] | None = None, seq: int = 512) -> dict[str, Any]:
    return dict(name="host", model=model or {k: v for k, v in MOE_TINY.items() if k != "moe"},
                hardware=dict(node="dgx-h100", n_nodes=1), layout=dict(tp=1, dp=8, ep=8 if model else 1),
                train=dict(seq_len=seq, global_batch_seqs=32, micro_batch_size=1, stack=stack))


def test_cuda_graphs_and_no_syncs_make_a_small_model_faster_end_to_end() -> None:
    eager = simulate(_run("megatron-te")).step_time_s
    graphed = simulate(_run({"preset": "megatron-te", "cuda_graphs": True})).step_time_s
    assert graphed < eager
    moe = simulate(_run("megatron-te", MOE_TINY)).step_time_s
    padded = simulate(_run({"preset": "megatron-te", "moe_token_count_sync": False}, MOE_TINY)).step_time_s
    assert padded < moe


def test_the_loss_check_costs_each_micro_batch_a_sync_end_to_end() -> None:
    base = _run("megatron-te")
    checked = simulate(base).step_time_s
    unchecked = simulate(_run({"preset": "megatron-te", "loss_check_sync": False})).step_time_s
    # 32 sequences over dp 8, micro-batch 1: 4 micro-batches, each one sync of at least HOST_SYNC_S
    assert checked - unchecked >= 4 * HOST_SYNC_S * (1 - 1e-9)


def test_a_te_grouped_gemm_issues_one_gemm_per_local_expert() -> None:
    # 16 local experts of 2 us each after the MoE sync, 8 us of CPU per launch: CPU-bound, the GPU waits
    # for the last expert's issue: D = 16 x 8 - 15 x 2 = 98 us, plus the sync's round trip
    expert = Kernel("expert.up", 0.0, 0.0, 32 * US, shape=(512, 1024, 2048, 16))
    te = HostModel(8 * US, frozenset({"moe.permute"}), per_expert_launch=True)
    one = HostModel(8 * US, frozenset({"moe.permute"}))
    ops = [_op(0, (_k("router", 1e-3), _k("moe.permute", 20 * US))), _op(1, (expert,))]
    gap_te = add_host_gaps(list(ops), te)[1].duration_s - ops[1].duration_s  # type: ignore[attr-defined]
    gap_one = add_host_gaps(list(ops), one)[1].duration_s - ops[1].duration_s  # type: ignore[attr-defined]
    assert gap_te == pytest.approx(HOST_SYNC_S + 16 * 8 * US - 15 * 2 * US)
    assert gap_one == pytest.approx(HOST_SYNC_S + 8 * US)
    assert STACKS["megatron-te"].grouped_gemm_per_expert and not STACKS["torchtitan-compile"].grouped_gemm_per_expert


# -- per-expert quantisation (Transformer Engine split_quantize) --------------------------------------------

def test_a_te_fp8_expert_gemm_issues_a_cast_and_a_gemm_per_local_expert() -> None:
    # 16 local experts of 2 us each; with the per-expert cast 32 launches of 8 us CPU and 1 us GPU each:
    # D = 32 x 8 - 31 x 1 = 225 us (one launch per expert: 16 x 8 - 15 x 2 = 98 us); the weight
    # gradient reuses the column-wise copies: one launch per expert
    model = HostModel(8 * US, frozenset({"moe.permute"}), per_expert_launch=True, per_expert_cast=True)
    router = _op(0, (_k("router", 1e-3), _k("moe.permute", 20 * US)))
    for name, gap in (("expert.up", 32 * 8 - 31 * 1), ("expert.up.dgrad", 225), ("expert.up.wgrad", 98)):
        ops = [router, _op(1, (Kernel(name, 0.0, 0.0, 32 * US, shape=(512, 1024, 2048, 16)),))]
        got = add_host_gaps(list(ops), model)[1].duration_s - ops[1].duration_s  # type: ignore[attr-defined]
        assert got == pytest.approx(HOST_SYNC_S + gap * US), name


def test_only_fp8_recipes_without_a_fused_multi_tensor_cast_quantise_per_expert() -> None:
    stack = STACKS["megatron-te"]
    for recipe, per_expert in (("blockwise", True), ("current", True), ("delayed", False), (None, False)):
        model = host_model(stack, "b200", recipe)
        assert model is not None and model.per_expert_cast is per_expert, recipe
    titan = host_model(STACKS["torchtitan-compile"], "b200", "blockwise")
    assert titan is not None and not titan.per_expert_cast  # one grouped kernel, no per-expert loop


def _fp8_moe(recipe: str) -> dict[str, Any]:
    run = _run("megatron-te", MOE_TINY)
    run["train"].update(precision="fp8", fp8_recipe=recipe)
    run["hardware"] = dict(node="dgx-b200", n_nodes=1)
    return run


def test_per_expert_casts_never_make_a_step_faster_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    mx, delayed = simulate(_fp8_moe("blockwise")).step_time_s, simulate(_fp8_moe("delayed")).step_time_s
    monkeypatch.setattr("simtrain.cost.host.FUSED_SPLIT_QUANTIZE_RECIPES", frozenset({"delayed", "blockwise"}))
    assert mx > simulate(_fp8_moe("blockwise")).step_time_s
    # delayed scaling's one fused cast was never per expert: unchanged
    assert simulate(_fp8_moe("delayed")).step_time_s == delayed


def _one_node_dp8() -> tuple[RankGrid, Topology, Any]:
    """A DGX H100's eight GPUs as one data-parallel group: (grid, fabric, GPU)."""
    cl = build_cluster("dgx-h100", 1)
    return RankGrid(LayoutConfig(dp=8)), Topology(cl), cl.gpu


def _all_reduce_and_a(stall: float, after: bool, host_sync: bool = False) -> list[Program]:
    """A 4 GB data-parallel all-reduce and a 100 us compute op "a" with ``stall`` seconds of host stall,
    beside it or, ``after``, waiting for it."""
    p = Program(0)
    ar = p.add(OpKind.COLLECTIVE, Stream.DP, "ar", category="comm", coll=ALL_REDUCE, axis="dp", comm_bytes=4e9)
    p.add(OpKind.COMPUTE, Stream.COMPUTE, "a", category="fwd", deps=(ar.idx,) if after else (), duration_s=100 * US,
          host_stall_s=stall, host_sync=host_sync, host_hideable_s=0.0 if host_sync else stall)
    return [p]


def test_the_engine_does_not_slow_a_host_stall_by_the_collectives_in_flight() -> None:
    """A compute op of 100 us whose first 60 us are a host stall (GPU idle), beside a long all-reduce: only its
    40 us of kernels run at 1 / (1 + interference); the stall is neither stretched nor scaled by speed."""
    grid, topo, gpu = _one_node_dp8()

    def end_of_a(stall: float, speed: float = 1.0) -> float:
        res = Engine(_all_reduce_and_a(stall, False), grid, topo, gpu, symmetric=False,
                     speed={r: speed for r in range(8)}).run()
        return next(e.end_s for e in res.trace if e.rank == 0 and e.name == "a")

    slow = 1 + gpu.comm_interference_nvlink
    assert end_of_a(0.0) == pytest.approx(100 * US * slow, rel=1e-9)
    assert end_of_a(60 * US) == pytest.approx(60 * US + 40 * US * slow, rel=1e-9)
    assert end_of_a(60 * US, speed=0.5) == pytest.approx(60 * US + 80 * US * slow, rel=1e-9)


def test_a_wait_before_the_first_op_hides_its_host_stall_up_to_its_first_sync() -> None:
    """``RunAhead``: the step's first compute op, with a stall of 60 us after a wait of 40 us, idles 20 us (the
    CPU issued meanwhile); later ops keep their stalls; of a first op that synchronises, only the part before
    the sync hides (``host_hideable_s``)."""
    op = replace(_op(0, (_k("a", 40 * US),)), host_stall_s=60 * US, host_hideable_s=60 * US)
    ra = RunAhead()
    assert ra.stall(op, 40 * US) == pytest.approx(20 * US) and ra.stall(op, 100 * US) == pytest.approx(60 * US)
    assert RunAhead().stall(op, 100 * US) == 0.0
    assert RunAhead().stall(replace(op, host_sync=True, host_hideable_s=0.0), 1.0) == pytest.approx(60 * US)
    assert RunAhead().stall(replace(op, host_sync=True, host_hideable_s=25 * US), 1.0) == pytest.approx(35 * US)


def test_the_host_pass_marks_what_a_wait_can_hide() -> None:
    """No sync: all of the stall; a MoE sync inside: the stall before it; a sync at the start (the gradient
    norm's): only the collective call the CPU still owed before it."""
    model = HostModel(8 * US, frozenset({"moe.permute"}), sync_before_optimizer=True, cpu_collective_s=90 * US)
    plain = add_host_gaps([_op(0, (_k("a", 1 * US),))], model)[0]
    assert plain.host_hideable_s == plain.host_stall_s == pytest.approx(8 * US)  # type: ignore[attr-defined]
    moe = add_host_gaps([_op(0, (_k("router", 1 * US), _k("moe.permute", 1 * US), _k("expert.up", 1 * US)))],
                        model)[0]
    # up to the sync: the permute is issued at 16 us, the router done at 9 us (lead 15 us); after it: round trip
    # + the expert's issue
    assert moe.host_stall_s == pytest.approx(15 * US + HOST_SYNC_S + 8 * US)  # type: ignore[attr-defined]
    assert moe.host_hideable_s == pytest.approx(15 * US)  # type: ignore[attr-defined]
    ar = CollectiveOp(1, Stream.DP, "dp", "comm", coll=ALL_REDUCE, axis="dp", comm_bytes=1e6)
    opt = add_host_gaps([_op(0, (_k("a", 1 * US),)), ar, _op(2, (_k("adam", 1 * US),), "optimizer")], model)[2]
    assert opt.host_hideable_s == pytest.approx(90 * US - 1 * US)  # type: ignore[attr-defined]
    assert opt.host_stall_s == pytest.approx(89 * US + HOST_SYNC_S + 8 * US)  # type: ignore[attr-defined]


@pytest.mark.parametrize("host_sync", [False, True])
def test_both_evaluators_hide_a_host_stall_behind_the_wait_for_a_collective(host_sync: bool) -> None:
    """The step's first compute op, of 100 us, 60 us of it a host stall, waits for an all-reduce of T >> 60 us
    (as for ZeRO-1's parameter gathers): it ends at T + 40 us in the engine and the critical-path evaluator
    alike (the CPU issued its kernels while the GPU waited); when the op synchronises with the host, at
    T + 100 us."""
    grid, topo, gpu = _one_node_dp8()
    res = Engine(_all_reduce_and_a(60 * US, True, host_sync), grid, topo, gpu, symmetric=True).run()
    ar_end = next(e.end_s for e in res.trace if e.rank == 0 and e.name == "ar")
    a_end = next(e.end_s for e in res.trace if e.rank == 0 and e.name == "a")
    assert ar_end > 1e-3
    assert a_end == pytest.approx(ar_end + (100 if host_sync else 40) * US, rel=1e-9)
    cp = evaluate(_all_reduce_and_a(60 * US, True, host_sync), grid, topo, gpu)
    assert cp.op_end_s[0][1] - cp.op_end_s[0][0] == pytest.approx((100 if host_sync else 40) * US, rel=1e-9)
