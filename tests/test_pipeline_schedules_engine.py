"""Zero-bubble and DualPipe schedules run through lowering and the engine (not only the evaluator)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.lower.layer_plan import split_layers
from simtrain.lower.ops import CommOp, ComputeOp, CostedComputeOp
from simtrain.plan.load import load_config
from simtrain.plan.schedules import ActionCosts, build_schedule, makespan
from simtrain.studies.simulate import simulate

TINY = dict(name="tiny", n_layers=16, hidden=1024, n_heads=8, n_kv_heads=4, ffn_hidden=4096,
            activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False,
            linear_bias=False)
BASE = dict(model=TINY, hardware=dict(n_nodes=1), layout=dict(pp=8), train=dict(seq_len=2048, global_batch_seqs=16))


def _costs(schedule: str, stage: int = 1) -> dict[str, float]:
    """Per-micro-batch compute time of F, B (input grads when split) and W on one middle stage."""
    run = load_config(BASE, [f"layout.schedule={schedule}"])
    low = lower(run, ComputeCostModel(load_gpu("h100-sxm"), "bf16", stack=run.train.stack_spec))
    out: dict[str, float] = defaultdict(float)
    for op in low.programs[stage].ops:
        if isinstance(op, CostedComputeOp) and op.kernels and op.microbatch == 3 and op.chunk == 0:
            kind = "W" if all(k.name.endswith(".wgrad") for k in op.kernels) else op.category
            out[kind] += op.duration_s
    return out


def test_zb_h1_removes_two_weight_passes_per_stage_from_the_bubble() -> None:
    """Qi et al. 2023: 1F1B's bubble is (p-1)(F+B+W), ZB-H1's (p-1)(F+B-W): 2(p-1)W less."""
    c = _costs("zb_h1")
    one = simulate(BASE, ["layout.schedule=1f1b"])
    zb = simulate(BASE, ["layout.schedule=zb_h1"])
    p = 8
    # 10 %: the last stage's W (LM head) differs from the middle stage's measured here
    assert one.breakdown_s["bubble"] - zb.breakdown_s["bubble"] == pytest.approx(2 * (p - 1) * c["W"], rel=0.1)
    assert zb.step_time_s < one.step_time_s
    # ZB-H1 keeps 1F1B's activation memory (same in-flight micro-batches)
    assert max(m.peak_bytes for m in zb.memory) <= max(m.peak_bytes for m in one.memory) * 1.05


def test_engine_step_follows_the_schedule_evaluator() -> None:
    """With each stage's lowered F/B/W costs, makespan() predicts the engine's step (minus the optimizer)
    within 5 % for 1F1B and ZB-H1 (the engine adds p2p transfers and latencies)."""
    costs = [_costs("zb_h1", s) for s in range(8)]

    def cost(stage: int, chunk: int) -> ActionCosts:
        return ActionCosts(costs[stage]["fwd"], costs[stage]["bwd"], costs[stage]["W"])

    for kind in ("1f1b", "zb_h1"):
        ideal = makespan(build_schedule(kind, 8, 16), cost).makespan_s
        r = simulate(BASE, [f"layout.schedule={kind}"])
        assert r.step_time_s - r.breakdown_s["optimizer"] == pytest.approx(ideal, rel=0.05)


def test_dualpipe_beats_1f1b_and_holds_two_parameter_copies() -> None:
    one = simulate(BASE, ["layout.schedule=1f1b"])
    dual = simulate(BASE, ["layout.schedule=dualpipe"])
    assert dual.breakdown_s["bubble"] < 0.3 * one.breakdown_s["bubble"]
    # each rank holds two model stages: twice the weights of 1F1B's middle stage
    w1 = one.memory[3].components["weights"]
    w2 = dual.memory[3].components["weights"]
    assert w2 == pytest.approx(2 * w1, rel=1e-9)


@pytest.mark.parametrize("kind", ["zb_h1", "dualpipe", "dualpipev"])
def test_new_schedules_symmetric_equals_full_and_ledger_matches_closed_form(kind: str) -> None:
    cfg = dict(BASE, layout=dict(pp=4, dp=2, schedule=kind))
    sym, full = simulate(cfg, mode="symmetric"), simulate(cfg, mode="full")
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    for m in sym.memory:
        assert m.peak_bytes == pytest.approx(m.closed_form_peak_bytes, rel=0.02)


def test_uneven_interleaved_stages_for_405b() -> None:
    """126 layers over pp=16 x vpp=8 positions: the first and last position give up a layer each
    (Llama 3 405B), and an interleaved schedule with m % p != 0 runs."""
    from simtrain.plan.schedules import Route
    layers = split_layers(126, 16, 8, Route("interleaved", 16, 8))
    assert sum(map(sum, layers)) == 126
    assert layers[0][0] == 0 and layers[15][7] == 0 and layers[1][0] == 1
    r = simulate(dict(BASE, layout=dict(pp=4, vpp=3, dp=2)), ["train.global_batch_seqs=12"])
    assert r.microbatches == 6 and r.step_time_s > 0


def test_tp_comm_overlap_hides_tensor_parallel_communication() -> None:
    """Chunked all-gather/GEMM/reduce-scatter pipelining (Megatron --tp-comm-overlap) must expose less TP
    time and, on a 70B layer's GEMMs, give a shorter step than the unchunked collectives."""
    cfg = dict(model="llama3-70b", hardware=dict(n_nodes=1),
               layout=dict(tp=8, sequence_parallel=True, recompute="full"), train=dict(seq_len=8192, global_batch_seqs=2))
    plain = simulate(cfg, ["layout.tp_comm_overlap=false"])
    over = simulate(cfg, ["layout.tp_comm_overlap=true"])
    assert over.breakdown_s["exposed_comm"]["tp"] < 0.6 * plain.breakdown_s["exposed_comm"]["tp"]
    assert over.step_time_s < 0.95 * plain.step_time_s


def test_tp_comm_overlap_pays_for_its_chunked_gemms() -> None:
    """The GEMMs fused with a TP collective run as TP_OVERLAP_CHUNKS GEMMs of m / chunks rows: on the 8B
    at one 8k sequence per TP8 rank group the chunks' quantisation costs about what the overlap hides
    (NeMo's 8B recipes run without TP), while the 70B above gains."""
    from simtrain.lower.blocks import TP_OVERLAP_CHUNKS

    cost = ComputeCostModel(load_gpu("h100-sxm"), "bf16")
    whole = cost.gemm("qkv", 8192, 768, 4096)
    chunked = cost.row_chunked(whole, TP_OVERLAP_CHUNKS)
    part = cost.gemm("qkv", 8192 // TP_OVERLAP_CHUNKS, 768, 4096)
    assert chunked.time_s == pytest.approx(TP_OVERLAP_CHUNKS * part.time_s) and chunked.time_s > whole.time_s
    assert cost.row_chunked(cost.memory_op("act", 1e6), 4).time_s == cost.memory_op("act", 1e6).time_s
    cfg = dict(model="llama3-8b", hardware=dict(n_nodes=1), layout=dict(tp=8, sequence_parallel=True),
               train=dict(seq_len=8192, global_batch_seqs=2))
    plain = simulate(cfg, ["layout.tp_comm_overlap=false"])
    over = simulate(cfg, ["layout.tp_comm_overlap=true"])
    assert over.breakdown_s["exposed_comm"]["tp"] < plain.breakdown_s["exposed_comm"]["tp"]
    assert over.breakdown_s["compute"] > plain.breakdown_s["compute"]
    assert over.step_time_s == pytest.approx(plain.step_time_s, rel=0.03)


def test_tp_comm_overlap_pipelines_only_with_the_fused_gemms() -> None:
    """TE userbuffers / torch async TP fuse a TP all-gather with the GEMM it feeds and a reduce-scatter with
    the GEMM that produces it: no TP collective is in flight while core attention or the activation runs,
    while some TP collective is in flight beside a GEMM."""
    cfg = dict(model="llama3-8b", hardware=dict(n_nodes=1), layout=dict(tp=8, sequence_parallel=True,
                                                                         tp_comm_overlap=True),
               train=dict(seq_len=8192, global_batch_seqs=2))
    r = simulate(cfg, mode="full", trace=True)
    rank0 = [e for e in r.trace if e.rank == 0]
    tp = [(e.start_s, e.end_s) for e in rank0 if e.name.startswith("tp.")]
    tol = 1e-12

    def busy(e: object) -> bool:
        return any(s < e.end_s - tol and e.start_s + tol < t for s, t in tp)  # type: ignore[attr-defined]

    non_gemm = [e for e in rank0 if e.stream == "compute" and isinstance(e.op, ComputeOp) and e.op.kernels
                and all(k.name.startswith(("flash_attn", "act", "rope")) for k in e.op.kernels)]
    gemms = [e for e in rank0 if e.stream == "compute" and isinstance(e.op, ComputeOp) and e.op.kernels
             and all(k.name.startswith(("qkv", "out_proj", "mlp_up", "mlp_down")) for k in e.op.kernels)]
    assert non_gemm and gemms
    assert not any(busy(e) for e in non_gemm)
    assert any(busy(e) for e in gemms)


def test_gathered_gemms_exclude_weight_gradients() -> None:
    """An all-gather pipelines with the GEMMs that read the gathered tensor as their row-split operand
    (fprop, dgrad); a weight-gradient GEMM contracts over the gathered dim and waits for all of it."""
    from simtrain.lower.blocks import leading_gemms
    from simtrain.lower.ops import Kernel

    dgrad, wgrad = Kernel("mlp_down.dgrad", 1e12, 1e9, 1e-3), Kernel("mlp_down.wgrad", 1e12, 1e9, 1e-3)
    act = Kernel("act.bwd", 0.0, 1e9, 1e-4)
    assert leading_gemms((dgrad, wgrad, act)) == 2  # a reduce-scatter after them is fed by both (TE bulk wgrad)
    assert leading_gemms((dgrad, wgrad, act), gathered=True) == 1
    assert leading_gemms((Kernel("qkv", 1e12, 1e9, 1e-3), act), gathered=True) == 1


def test_search_estimate_prices_tp_comm_overlap_like_the_engine() -> None:
    """The layout search's closed form pipelines each TP collective with its fused GEMMs, as lowering does:
    Llama 3 70B at TP 8 with overlap on, within 5 % of the engine, and faster than with overlap off."""
    from simtrain.studies.estimate import Estimator
    from simtrain.studies.simulate import cluster_of

    cfg = dict(model="llama3-70b", hardware=dict(n_nodes=8),
               layout=dict(tp=8, dp=8, sequence_parallel=True, tp_comm_overlap=True),
               train=dict(seq_len=8192, global_batch_seqs=64))
    times = {}
    for overlap in (True, False):
        run = load_config(cfg, [f"layout.tp_comm_overlap={str(overlap).lower()}"])
        times[overlap] = Estimator(run.model, cluster_of(run)).estimate(run.layout, run.train).step_time_s
    assert times[True] == pytest.approx(simulate(cfg).step_time_s, rel=0.05)
    assert times[True] < times[False]


def test_deepspeed_pipeline_engine_reduces_gradients_after_the_flush() -> None:
    """DeepSpeed's PipelineEngine with its BF16 optimizer (ZeRO-1) all-reduces the fp32 gradients after
    the stage's last backward (ReduceGrads) and all-gathers the parameters after the optimizer step;
    Megatron-core reduce-scatters them bucket by bucket while the backward runs."""
    cfg = dict(BASE, hardware=dict(n_nodes=2), layout=dict(pp=2, dp=8, zero_stage=1))
    runs = {stack: simulate(cfg, [f"train.stack={stack}"], mode="full", trace=True)
            for stack in ("deepspeed", "megatron-te")}
    for stack, coll in (("deepspeed", "all_reduce"), ("megatron-te", "reduce_scatter")):
        rank0 = [e for e in runs[stack].trace if e.rank == 0]
        grads = [e for e in rank0 if isinstance(e.op, CommOp) and e.op.axis == "dp" and e.op.coll.kind != "all_gather"]
        assert grads and all(isinstance(e.op, CommOp) and e.op.coll.kind == coll for e in grads)
        last_bwd = max(e.end_s for e in rank0 if e.category == "bwd")
        optimizer = next(e for e in rank0 if e.category == "optimizer")
        gathers = [e for e in rank0 if isinstance(e.op, CommOp) and e.op.axis == "dp" and e.op.coll.kind == "all_gather"]
        if stack == "deepspeed":
            assert min(e.start_s for e in grads) >= last_bwd - 1e-12
            assert gathers and min(e.start_s for e in gathers) >= optimizer.end_s - 1e-12
        else:
            assert min(e.start_s for e in grads) < last_bwd
    dp = {s: r.breakdown_s["exposed_comm"]["dp"] for s, r in runs.items()}
    assert dp["deepspeed"] > dp["megatron-te"]


def test_deepspeed_bf16_optimizer_adds_each_microbatch_gradients_into_fp32() -> None:
    """DeepSpeed's pipeline engine with the BF16 optimizer runs update_hp_grads after every micro-batch's
    backward (hp_grad.add_(lp.grad.to(float32)): 18 bytes per parameter of the rank's chunk), before the
    gradient goes upstream; Megatron-core fuses the FP32 accumulation into the wgrad GEMM (no pass), and
    without PP the pass is not run (the BF16 optimizer path modelled is the pipeline engine's)."""
    from simtrain.lower.ops import OpKind
    from simtrain.lower.stack_rules import FP32_GRAD_ACCUMULATION_BYTES_PER_PARAM
    from simtrain.spec.stacks import get_stack

    cfg = dict(BASE, hardware=dict(n_nodes=2), layout=dict(pp=2, dp=8, zero_stage=1))
    res = simulate(cfg, ["train.stack=deepspeed"], mode="full", trace=True)
    rank0 = [e for e in res.trace if e.rank == 0 and e.op.kind == OpKind.COMPUTE]
    passes = [e for e in rank0 if e.op.name == "grad.fp32_accumulate"]
    assert sorted(e.op.microbatch for e in passes) == list(range(res.microbatches))
    run = load_config(cfg, ["train.stack=deepspeed"])
    low = lower(run, ComputeCostModel(load_gpu("h100-sxm"), "bf16", stack=get_stack("deepspeed")))
    (kernel,) = passes[0].op.kernels
    assert kernel.bytes == pytest.approx(FP32_GRAD_ACCUMULATION_BYTES_PER_PARAM * low.stage_params[0])
    for e in passes:  # after every other backward kernel of its micro-batch
        mb = e.op.microbatch
        assert max(x.end_s for x in rank0 if x.op.microbatch == mb and x.category == "bwd" and x is not e) \
            <= e.start_s + 1e-12
    for overrides in (["train.stack=megatron-te"], ["train.stack=deepspeed", "layout.pp=1", "layout.dp=16"]):
        other = simulate(cfg, overrides, mode="full", trace=True)
        assert not [e for e in other.trace if e.op.name == "grad.fp32_accumulate"]


def test_search_estimate_prices_the_fp32_accumulation_pass_like_the_engine() -> None:
    """The closed form adds the same pass to each chunk's backward: GPT-3 175B in BLOOM's layout (TP 4,
    PP 12, DP 8 on A100s) under the deepspeed stack, within 3 % of the engine (the pass is ~7 % of the step)."""
    from simtrain.studies.estimate import Estimator
    from simtrain.studies.simulate import cluster_of

    cfg = dict(model=dict(preset="gpt3-175b", vocab=50304), hardware=dict(gpu="a100-80gb", node="dgx-a100", n_nodes=48),
               layout=dict(tp=4, pp=12, dp=8, zero_stage=1, sequence_parallel=False, recompute="full"),
               train=dict(seq_len=2048, micro_batch_size=2, global_batch_seqs=384, stack="deepspeed"))
    run = load_config(cfg)
    est = Estimator(run.model, cluster_of(run)).estimate(run.layout, run.train).step_time_s
    assert est == pytest.approx(simulate(cfg).step_time_s, rel=0.03)


def test_tied_embedding_gradients_are_all_reduced_between_the_end_stages() -> None:
    """Megatron's finalize_model_grads all-reduces the tied embedding's fp32 main grad (V x h / tp x 4
    bytes) between the first and last stage, blocking, before the optimizer: over one 200 Gb/s NIC per
    GPU a 2-rank all-reduce moves the whole buffer once (half out, half back). Symmetric = full mode,
    the search estimate adds the same; nothing when one rank holds both ends (DualPipeV) or the
    pipeline is torch's (no embedding group)."""
    from simtrain.studies.estimate import Estimator
    from simtrain.studies.simulate import cluster_of

    cfg = dict(model=dict(preset="gpt3-175b", vocab=51200), hardware=dict(node="dgx-a100", n_nodes=2),
               layout=dict(tp=8, pp=2, vpp=2, recompute="full"),
               train=dict(seq_len=2048, micro_batch_size=1, global_batch_seqs=8, grad_dtype="fp32"))
    untie = ["model.tied_embeddings=false"]
    tied, untied = simulate(cfg), simulate(cfg, untie)
    expected = 51200 * 12288 / 8 * 4 / 25e9  # bytes / NIC bytes per second
    assert tied.step_time_s - untied.step_time_s == pytest.approx(expected, rel=0.1)
    extra_pp = tied.breakdown_s["exposed_comm"]["pp"] - untied.breakdown_s["exposed_comm"]["pp"]
    assert extra_pp == pytest.approx(expected, rel=0.1)
    assert simulate(cfg, mode="full").step_time_s == pytest.approx(tied.step_time_s, rel=1e-4)

    def estimate(overrides: list[str]) -> float:
        run = load_config(cfg, overrides)
        return Estimator(run.model, cluster_of(run)).estimate(run.layout, run.train).step_time_s
    assert estimate([]) - estimate(untie) == pytest.approx(expected, rel=0.1)
    for other in (["layout.schedule=dualpipev", "layout.vpp=1"], ["train.stack=torchtitan-compile"]):
        assert simulate(cfg, other).step_time_s == pytest.approx(simulate(cfg, other + untie).step_time_s, rel=1e-9)
