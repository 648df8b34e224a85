"""FSDP2 as torchtitan runs it (per-parameter copies; a stage kept unsharded under PP) and the cost
of FP8 split accumulation on Hopper."""

from __future__ import annotations

import pytest

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.hardware.profile import compute_calibration, run_cluster
from simtrain.lower.lowering import Lowered
from simtrain.lower.ops import ComputeOp, OpKind
from simtrain.plan.load import load_config
from simtrain.spec.stacks import get_stack
from simtrain.studies.simulate import simulate

LLAMA_TINY = dict(name="ltiny", n_layers=8, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1408,
                  activation="swiglu", norm="rmsnorm", position="rope", vocab=8192, tied_embeddings=False,
                  linear_bias=False)
PP, DP, SEQS = 2, 4, 16  # 4 micro-batches of one sequence per DP rank


def _cfg(stack: str, pp: int = PP) -> dict:
    return dict(model=LLAMA_TINY, hardware=dict(n_nodes=1),
                layout=dict(pp=pp, dp=DP * PP // pp, fsdp="full"),
                train=dict(seq_len=1024, global_batch_seqs=SEQS, micro_batch_size=1, stack=stack))


def _lowered(stack: str, pp: int = PP) -> Lowered:
    run = load_config(_cfg(stack, pp))
    gpu = run_cluster(run.hardware, run.layout.world_size).gpu
    cost = ComputeCostModel(gpu, run.train.precision, calibration=compute_calibration(gpu),
                            stack=get_stack(run.train.stack), fp8_recipe=run.train.fp8_recipe)
    return lower(run, cost)


def _names(low: Lowered, stage: int, prefix: str) -> list[str]:
    return [op.name for op in low.programs[stage].ops if op.name.startswith(prefix)]


def test_torchtitan_gathers_a_pipeline_stage_once_per_step() -> None:
    """reshard_after_forward=False under PP: one all-gather per layer per step (pytorch-eager re-gathers
    each layer in every micro-batch's forward and backward), one reduce-scatter per layer after the
    stage's last backward."""
    layers_per_stage = LLAMA_TINY["n_layers"] // PP
    micro = SEQS // (DP * 1)
    titan, eager = _lowered("torchtitan-eager"), _lowered("pytorch-eager")
    for s in range(PP):
        assert len(_names(titan, s, "fsdp.all_gather")) == layers_per_stage
        assert len(_names(eager, s, "fsdp.all_gather")) == 2 * micro * layers_per_stage
        assert len(_names(titan, s, "fsdp.reduce_scatter")) == layers_per_stage
        assert len(_names(eager, s, "fsdp.reduce_scatter")) == micro * layers_per_stage
        # every reduce-scatter follows the stage's last backward compute op (the embedding / last layer)
        ops = titan.programs[s].ops
        last_bwd = max(op.idx for op in ops if op.kind == OpKind.COMPUTE and op.category == "bwd"
                       and not op.name.startswith("fsdp."))
        assert all(op.idx > last_bwd for op in ops if op.name.startswith("fsdp.reduce_scatter"))


def test_fsdp2_copies_follow_each_gather_and_precede_each_reduce_scatter() -> None:
    titan, eager = _lowered("torchtitan-eager", pp=1), _lowered("pytorch-eager", pp=1)
    micro = SEQS // (DP * PP)  # micro-batches per rank without PP
    n_gathers = 2 * micro * LLAMA_TINY["n_layers"]  # every layer, forward and backward, every micro-batch
    assert len(_names(titan, 0, "fsdp.copy_out")) == len(_names(titan, 0, "fsdp.all_gather")) == n_gathers
    assert len(_names(titan, 0, "fsdp.copy_in")) == len(_names(titan, 0, "fsdp.reduce_scatter"))
    assert not _names(eager, 0, "fsdp.copy")
    # a copy-out moves the layer's unsharded bf16 parameters twice (read + write)
    copy = next(op for op in titan.programs[0].ops if op.name == "fsdp.copy_out")
    gather = next(op for op in titan.programs[0].ops if op.name.startswith("fsdp.all_gather"))
    assert copy.kernels[0].bytes == pytest.approx(2.0 * gather.comm_bytes)


def test_a_kept_stage_holds_its_parameters_and_fp32_gradients_unsharded() -> None:
    run = load_config(_cfg("torchtitan-eager"))
    low = _lowered("torchtitan-eager")
    res = simulate(_cfg("torchtitan-eager"))
    for s, mem in enumerate(res.memory):
        # bf16 parameters (2) + fp32 accumulated gradients (4) of every layer of the stage and of its
        # root parameters (embedding / final norm / LM head: FSDP's root unit is never resharded either)
        root = low.stage_params[s] + low.stage_expert_params[s] - low.stage_layer_params[s]
        assert root > 0
        assert mem.components["comm_buffers"] == pytest.approx(6.0 * (low.stage_layer_params[s] + root), rel=1e-9)
        assert mem.peak_bytes == pytest.approx(mem.closed_form_peak_bytes, rel=0.01)
    assert run.layout.shard_stage == 3
    # without PP nothing is kept: per-layer gather buffers only
    flat = simulate(_cfg("torchtitan-eager", pp=1)).memory[0].components["comm_buffers"]
    assert flat < res.memory[0].components["comm_buffers"]


def test_a_kept_stage_adds_each_microbatch_gradients_into_fp32_before_reducing() -> None:
    """FSDP2 without gradient sync (torchtitan under PP, reduce dtype fp32): every micro-batch's backward
    ends with ``unsharded_accumulated_grad += grad`` over the chunk's parameters (fp32 read + bf16 read +
    fp32 write = 10 B each), and the stage's reduce-scatters follow the last one. A bf16 reduce dtype keeps
    autograd's own accumulation (no pass); without PP FSDP2 reduce-scatters every backward (no pass)."""
    from simtrain.lower.stack_rules import FSDP2_UNSHARDED_ACCUMULATION_BYTES_PER_PARAM

    micro = SEQS // DP
    titan = _lowered("torchtitan-eager")
    for s in range(PP):
        ops = titan.programs[s].ops
        passes = [op for op in ops if op.name == "grad.fp32_accumulate"]
        assert sorted(op.microbatch for op in passes) == list(range(micro))
        assert passes[0].kernels[0].bytes == pytest.approx(
            FSDP2_UNSHARDED_ACCUMULATION_BYTES_PER_PARAM * titan.stage_params[s], rel=1e-12)
        last = max(op.idx for op in passes)
        assert all(op.idx > last for op in ops if op.name.startswith("fsdp.reduce_scatter"))
        # the copy-in reads the fp32 accumulators (4 B) and writes the fp32 reduce-scatter input (4 B)
        layer_params = titan.stage_layer_params[s] / (LLAMA_TINY["n_layers"] // PP)
        copies = [op.kernels[0].bytes for op in ops if op.name == "fsdp.copy_in" and isinstance(op, ComputeOp)]
        assert copies and copies == pytest.approx([8.0 * layer_params] * len(copies))
    bf16 = load_config(_cfg("torchtitan-eager"), ["train.grad_dtype=bf16"])
    gpu = run_cluster(bf16.hardware, bf16.layout.world_size).gpu
    low = lower(bf16, ComputeCostModel(gpu, "bf16", stack=get_stack("torchtitan-eager")))
    assert not _names(low, 0, "grad.fp32_accumulate")
    assert not _names(_lowered("torchtitan-eager", pp=1), 0, "grad.fp32_accumulate")
    assert not _names(_lowered("pytorch-eager"), 0, "grad.fp32_accumulate")


@pytest.mark.parametrize("grad_dtype, per_param", [("bf16", 8.0), ("fp32", 18.0)])
def test_fsdp1_builds_each_flat_gradient_before_its_reduce_scatter(grad_dtype: str, per_param: float) -> None:
    """FSDP1 (Composer): the autograd ``cat`` of the views' gradients (2 + 2 B), a cast to a wider reduce
    dtype (2 + 4 B, fp32 only) and the in-place pre-divide (2 x G B) precede every layer's reduce-scatter,
    in every micro-batch; FSDP2 (torchtitan) copies instead and has no such pass."""
    from simtrain.lower.stack_rules import fsdp1_grad_bytes

    assert fsdp1_grad_bytes(2.0 if grad_dtype == "bf16" else 4.0) == per_param
    cfg = _cfg("composer-fsdp", pp=1)
    run = load_config(cfg, [f"train.grad_dtype={grad_dtype}"])
    gpu = run_cluster(run.hardware, run.layout.world_size).gpu
    low = lower(run, ComputeCostModel(gpu, "bf16", stack=get_stack("composer-fsdp")))
    ops = low.programs[0].ops
    flats = [op for op in ops if op.name == "fsdp.flat_grad"]
    scatters = [op for op in ops if op.name.startswith("fsdp.reduce_scatter")]
    assert len(flats) == len(scatters) == SEQS // (DP * PP) * LLAMA_TINY["n_layers"]
    layer_params = low.stage_layer_params[0] / LLAMA_TINY["n_layers"]
    for flat, scatter in zip(flats, scatters, strict=True):
        assert flat.kernels[0].bytes == pytest.approx(per_param * layer_params, rel=1e-9)
        assert flat.idx in scatter.deps  # the reduce-scatter waits for its flat gradient
    assert not _names(_lowered("torchtitan-eager", pp=1), 0, "fsdp.flat_grad")


@pytest.mark.parametrize("stack, per_param", [("torchtitan-compile", 72.0 + 5 * 4.0 + 2.0),
                                              ("megatron-te", 4.0 + 26.0)])
def test_foreach_adamw_moves_three_times_the_bytes_of_fused_adam(stack: str, per_param: float) -> None:
    """torchtitan's AdamW runs foreach (one HBM pass per operation, plus clip_grad_norm_'s norm and scale);
    Megatron's is one fused kernel: the optimizer step's bytes over the rank's shard of parameters."""
    cfg = dict(_cfg(stack, pp=1), train=dict(seq_len=1024, global_batch_seqs=SEQS, micro_batch_size=1,
                                             stack=stack, grad_dtype="fp32"))
    run = load_config(cfg)
    gpu = run_cluster(run.hardware, run.layout.world_size).gpu
    low = lower(run, ComputeCostModel(gpu, "bf16", stack=get_stack(stack)))
    (step,) = [op for op in low.programs[0].ops if op.name == "optimizer.step"]
    shard = run.layout.data_degree
    assert step.kernels[0].bytes == pytest.approx(per_param * low.stage_params[0] / shard, rel=1e-9)


@pytest.mark.parametrize("gpu_name, slower", [("h100-sxm", True), ("h200", True), ("b200", False)])
def test_fp8_split_accumulation_slows_backward_gemms_on_hopper(gpu_name: str, slower: bool) -> None:
    """TE and torchao promote dgrad/wgrad partial sums to FP32: 1.15x on Hopper, free on Blackwell;
    blockwise scaling promotes inside the kernel."""
    gpu = load_gpu(gpu_name)
    m = n = k = 8192  # square: fprop, dgrad and wgrad have the same shape and FLOPs

    def time_s(recipe: str, name: str) -> float:
        cost = ComputeCostModel(gpu, "fp8", fp8_recipe=recipe)
        cast = 0.0 if name.endswith(".wgrad") else 4.0 * m * k / (gpu.hbm_Bps * gpu.memory_op_efficiency)
        return cost.gemm(name, m, n, k).time_s - cast

    ratio = time_s("delayed", "mlp_up.wgrad") / time_s("delayed", "mlp_up")
    assert ratio == pytest.approx(1.15 if slower else 1.0, rel=1e-3)
    assert time_s("blockwise", "mlp_up.wgrad") == pytest.approx(time_s("blockwise", "mlp_up"), rel=1e-3)


@pytest.mark.parametrize("stack, weight_cast", [("torchtitan-compile", True), ("megatron-te", False),
                                                 ("megatron-core", False)])
def test_current_scaling_requantises_the_weight_only_without_te_weight_caching(stack: str, weight_cast: bool) -> None:
    """torchao's Float8Linear casts its weight in every forward (k x n elements at 6 B each: amax pass +
    cast-transpose); Transformer Engine caches the FP8 weight across a step's micro-batches."""
    gpu = load_gpu("h100-sxm")
    m, n, k = 8192, 4096, 4096
    cost = ComputeCostModel(gpu, "fp8", stack=get_stack(stack), fp8_recipe="current")
    with_weight = cost.gemm("mlp_up", m, n, k).time_s
    weight_part = with_weight - cost._gemm("mlp_up", m, n, k, 1, False, 1.0, weight_cast=False).time_s
    expected = 6.0 * k * n / (gpu.hbm_Bps * gpu.memory_op_efficiency) if weight_cast else 0.0
    assert weight_part == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_tp_overlap_chunks_quantise_the_weight_once() -> None:
    """Row-chunking a current-scaling FP8 GEMM for TP comm overlap repeats the matmul per chunk, not the
    weight's cast: parts x chunk matmul + one weight cast."""
    gpu = load_gpu("h100-sxm")
    cost = ComputeCostModel(gpu, "fp8", stack=get_stack("torchtitan-compile"), fp8_recipe="current")
    m, n, k, parts = 16384, 28672, 8192, 4
    whole = cost.gemm("mlp_up", m, n, k)
    weight_s = 6.0 * k * n / (gpu.hbm_Bps * gpu.memory_op_efficiency)
    chunk_mm = cost._gemm("mlp_up", m // parts, n, k, 1, False, 1.0, weight_cast=False).time_s
    assert cost.row_chunked(whole, parts).time_s == pytest.approx(parts * chunk_mm + weight_s, rel=1e-9)


def _tp_run(stack: str, precision: str = "bf16", overlap: bool = False, sp: bool = True,
            seq_len: int = 8192, seqs: int = 2):  # type: ignore[no-untyped-def]
    """Llama 3 8B at TP 8 (with SP unless ``sp`` is False) under ``stack`` on one H100 node: the run
    and its compute cost model."""
    run = load_config(dict(model="llama3-8b", hardware=dict(n_nodes=1),
                           layout=dict(tp=8, sequence_parallel=sp, tp_comm_overlap=overlap),
                           train=dict(seq_len=seq_len, global_batch_seqs=seqs, stack=stack, precision=precision,
                                      fp8_recipe=get_stack(stack).fp8_recipe)))
    cost = ComputeCostModel(load_gpu("h100-sxm"), precision, stack=get_stack(stack), fp8_recipe=run.train.fp8_recipe)
    return run, cost


def _tp_block(stack: str, precision: str = "bf16", overlap: bool = False, sp: bool = True):  # type: ignore[no-untyped-def]
    """The BlockBuilder lowering builds for ``_tp_run``."""
    from simtrain.lower.layer_plan import build_block

    run, _ = _tp_run(stack, precision, overlap, sp)
    return build_block(run.model, run.layout, run.train)


def test_dtensor_sequence_parallel_copies_around_each_tp_collective() -> None:
    """torch's functional collectives gather/scatter along dim 0, so torchtitan's Shard(1) sequence
    parallelism copies the whole gathered tensor after each all-gather and the whole input before each
    reduce-scatter (read + write); Megatron's [s, b, h] layout does not (async TP: the next test)."""
    from simtrain.lower.blocks import Comm

    segs = _tp_block("torchtitan-compile").layer_forward()
    for i, seg in enumerate(segs):
        if isinstance(seg, Comm) and seg.coll.kind == "all_gather":
            assert segs[i + 1][0].name == "tp.gather_copy"  # type: ignore[index]
            assert segs[i + 1][0].bytes == pytest.approx(2 * seg.size_bytes)  # type: ignore[index]
        if isinstance(seg, Comm) and seg.coll.kind == "reduce_scatter":
            assert segs[i - 1][-1].name == "tp.scatter_copy"  # type: ignore[index]
    copies = [k for s in segs if isinstance(s, tuple) for k in s if k.name.startswith("tp.")]
    assert len(copies) == 4
    assert not [k for s in _tp_block("megatron-te").layer_forward() if isinstance(s, tuple) for k in s
                if k.name.startswith("tp.")]


def test_async_tp_copies_the_shard_in_and_sums_the_stacked_partials() -> None:
    """torch async TP (torch/distributed/_symmetric_memory): a fused all-gather first copies the local
    shard into the symmetric-memory workspace (read + write of 1/t of the gathered bytes), and a fused
    reduce-scatter ends with a separate sum of the t stacked partials (read the whole unreduced output,
    write one shard), which waits for the collective; no full-tensor layout copies."""
    from simtrain.lower.blocks import Comm

    t = 8
    segs = _tp_block("torchtitan-compile", overlap=True).layer_forward()
    names = [k.name for s in segs if isinstance(s, tuple) for k in s if k.name.startswith("tp.")]
    assert names == ["tp.ag_shard_copy", "tp.rs_reduce"] * 2
    for i, seg in enumerate(segs):
        if isinstance(seg, Comm) and seg.coll.kind == "all_gather":
            copy = segs[i - 1][-1]  # type: ignore[index]
            assert copy.name == "tp.ag_shard_copy" and copy.bytes == pytest.approx(2 * seg.size_bytes / t)
        if isinstance(seg, Comm) and seg.coll.kind == "reduce_scatter":
            red = segs[i + 1][0]  # type: ignore[index]
            assert red.name == "tp.rs_reduce" and red.bytes == pytest.approx(seg.size_bytes * (1 + 1 / t))
    # the backward's fused gathers (output gradients) copy their shard; its summed reduce-scatters are
    # unfused (NCCL, with the layout copy before them)
    back = [k.name for s in _tp_block("torchtitan-compile", overlap=True).layer_backward() if isinstance(s, tuple)
            for k in s if k.name.startswith("tp.")]
    assert back.count("tp.ag_shard_copy") == 2 and back.count("tp.scatter_copy") == 2 and "tp.rs_reduce" not in back


def test_float8_tensor_parallel_gathers_in_fp8_after_casting_the_shard() -> None:
    """torchao Float8ColwiseParallel (torchtitan's default with tensorwise float8 and TP): the forward
    all-gathers move 1 byte per element and the column-parallel GEMMs quantise only their 1/t shard."""
    from simtrain.lower.blocks import Comm

    def gathers(block) -> list[float]:  # type: ignore[no-untyped-def]
        return [s.size_bytes for s in block.layer_forward() if isinstance(s, Comm) and s.coll.kind == "all_gather"]

    fp8, bf16 = _tp_block("torchtitan-compile", "fp8"), _tp_block("torchtitan-compile")
    assert gathers(fp8) == pytest.approx([g / 2 for g in gathers(bf16)])
    backward = [s.size_bytes for s in fp8.layer_backward() if isinstance(s, Comm) and s.coll.kind == "all_gather"]
    assert backward == pytest.approx(gathers(bf16))  # gradients are gathered in BF16
    qkv = [k for s in fp8.layer_forward() if isinstance(s, tuple) for k in s if k.name == "qkv"][0]
    te = [k for s in _tp_block("megatron-te", "fp8").layer_forward() if isinstance(s, tuple) for k in s
          if k.name == "qkv"][0]
    assert _tp_run("torchtitan-compile", "fp8")[1].kernel_time(qkv) < _tp_run("megatron-te", "fp8")[1].kernel_time(te)  # TE casts the gathered input (delayed scaling: 4 B/elem) x 8 elements


def test_async_tp_cannot_fuse_the_reduce_scatter_of_summed_input_gradients() -> None:
    """torchtitan's separate wq/wk/wv and w1/w3 linears sum their input gradients before the backward
    reduce-scatter, which async TP's matmul + reduce-scatter fusion does not match: those two run through
    the functional collectives (with their layout copy), blocking; Megatron's reduce-scatter of the QKV
    and FC1 input gradients runs beside their weight-gradient GEMMs (Transformer Engine's default "bulk"
    overlap for ``qkv_wgrad`` / ``fc1_wgrad``)."""
    from simtrain.lower.blocks import Comm

    def backward_scatters(block) -> list[tuple[bool, bool, str]]:  # type: ignore[no-untyped-def]
        segs = block.layer_backward()
        return [(s.fusable, s.overlap, segs[i - 1][-1].name) for i, s in enumerate(segs)
                if isinstance(s, Comm) and s.coll.kind == "reduce_scatter"]

    titan = backward_scatters(_tp_block("torchtitan-compile", overlap=True))
    assert titan == [(False, False, "tp.scatter_copy")] * 2
    megatron = backward_scatters(_tp_block("megatron-te", overlap=True))
    assert megatron == [(False, True, "mlp_up.dgrad"), (False, True, "qkv.dgrad")]
    forward = [s for s in _tp_block("torchtitan-compile", overlap=True).layer_forward() if isinstance(s, Comm)]
    assert forward and all(s.fusable for s in forward)


def test_megatron_sequence_parallel_regathers_the_input_for_the_weight_gradient() -> None:
    """Megatron saves a column-parallel layer's sequence-parallel input as its shard and all-gathers it
    again in backward, beside the dgrad GEMM, for the wgrad GEMM (Korthikanti et al. 2022, 4.2.2; TE
    userbuffers' "bulk" qkv_dgrad / fc1_dgrad); torchtitan's DTensor layers saved the gathered input."""
    from simtrain.lower.blocks import Comm

    for overlap in (False, True):
        segs = _tp_block("megatron-te", overlap=overlap).layer_backward()
        regathers = [i for i, s in enumerate(segs) if isinstance(s, Comm) and s.coll.kind == "all_gather" and s.overlap]
        assert len(regathers) == 2
        for i, column in zip(regathers, ("mlp_up", "qkv"), strict=True):
            dgrads, scatter, wgrads = segs[i + 1], segs[i + 2], segs[i + 3]
            assert isinstance(dgrads, tuple) and dgrads[-1].name == f"{column}.dgrad"
            assert not any(k.name.endswith(".wgrad") for k in dgrads)
            assert isinstance(scatter, Comm) and scatter.coll.kind == "reduce_scatter" and scatter.overlap
            assert isinstance(wgrads, tuple) and [k.name for k in wgrads] == [f"{column}.wgrad"]
            assert segs[i].size_bytes == pytest.approx(2.0 * 8192 * 4096)  # the whole sequence, BF16
    titan = _tp_block("torchtitan-compile").layer_backward()
    assert sum(isinstance(s, Comm) and s.coll.kind == "all_gather" for s in titan) == 2  # output gradients only


def test_weight_gradient_waits_for_the_regathered_input() -> None:
    """In the lowered program each column-parallel wgrad GEMM depends on the re-all-gather that ran
    beside its dgrad GEMM (two overlapped collectives in a row keep both dependencies)."""
    run, cost = _tp_run("megatron-te", overlap=True, seq_len=4096, seqs=1)
    ops = lower(run, cost).programs[0].ops
    wgrads = [op for op in ops if op.kind == OpKind.COMPUTE and op.name in ("mlp_up.wgrad", "qkv.wgrad")]
    assert len(wgrads) == 2 * run.model.n_layers
    for op in wgrads:
        waited = [ops[d] for d in op.deps]
        assert [(d.coll.kind, d.axis) for d in waited if d.kind == OpKind.COLLECTIVE] == [("all_gather", "tp")]
        before = [o for o in ops[:op.idx] if o.kind == OpKind.COMPUTE][-1]
        assert before.name == op.name.replace(".wgrad", ".dgrad")  # the dgrad ran beside the gather


def test_tensor_parallel_without_sp_all_reduces_the_input_gradient_beside_the_wgrad() -> None:
    """Without sequence parallelism Megatron all-reduces a column-parallel layer's input gradient
    asynchronously beside its wgrad GEMM (``async_grad_allreduce``); BigScience's Megatron-DeepSpeed
    (``copy_to_tensor_model_parallel_region``) all-reduces it after the layer's backward, blocking."""
    from simtrain.lower.blocks import Comm

    def backward(stack: str) -> list:  # type: ignore[type-arg]
        return _tp_block(stack, sp=False).layer_backward()

    segs = backward("megatron-legacy")
    reduces = [i for i, s in enumerate(segs) if isinstance(s, Comm)]
    assert len(reduces) == 2 and all(segs[i].coll.kind == "all_reduce" and segs[i].overlap for i in reduces)
    for i, column in zip(reduces, ("mlp_up", "qkv"), strict=True):
        assert segs[i - 1][-1].name == f"{column}.dgrad" and [k.name for k in segs[i + 1]] == [f"{column}.wgrad"]
    ds = backward("deepspeed")
    blocking = [(s.overlap, before[-1].name) for before, s in zip(ds, ds[1:], strict=False) if isinstance(s, Comm)]
    assert blocking == [(False, "mlp_up.wgrad"), (False, "qkv.wgrad")]


def test_tensorwise_fp8_on_dtensor_tp_all_reduces_each_amax() -> None:
    """torchao's tensorwise casts of TP-sharded DTensors take a global amax: one 4-byte all-reduce on the
    TP group per cast (per layer: 11 in forward, the module inputs, seven weights and two row-parallel
    inputs; 7 in backward, every linear's grad output), each before the all-gather it feeds, so
    async TP's fused gathers still meet their GEMMs. BF16, Transformer Engine's delayed scaling and TP 1
    run none."""
    from simtrain.lower.blocks import AMAX_BYTES, Comm

    def amaxes(segs: list) -> list:  # type: ignore[type-arg]
        return [s for s in segs if isinstance(s, Comm) and s.coll.kind == "all_reduce" and s.size_bytes == AMAX_BYTES]

    for overlap in (False, True):
        block = _tp_block("torchtitan-compile", "fp8", overlap=overlap)
        fwd, bwd = block.layer_forward(), block.layer_backward()
        assert len(amaxes(fwd)) == 11 and len(amaxes(bwd)) == 7
        assert all(s.axis == "tp" and not s.fused_with_gemm(overlap) for s in amaxes(fwd) + amaxes(bwd))
        for segs in (fwd, bwd):  # every all-gather is still followed by the compute it feeds
            for i, seg in enumerate(segs):
                if isinstance(seg, Comm) and seg.coll.kind == "all_gather":
                    assert isinstance(segs[i + 1], tuple)
    assert not amaxes(_tp_block("torchtitan-compile").layer_forward())
    assert not amaxes(_tp_block("megatron-te", "fp8").layer_forward())  # delayed scaling: once per step


def test_te_current_scaling_all_reduces_the_amax_of_what_it_gathers_in_fp8() -> None:
    """Transformer Engine's current scaling under SP reduces over TP only the amax of the tensors it
    all-gathers in FP8: the QKV and FC1 inputs in forward, the proj and FC2 grad outputs in backward,
    each right before its all-gather; weights are local shards with local scales."""
    from simtrain.lower.blocks import AMAX_BYTES, Comm
    from simtrain.lower.layer_plan import build_block

    run = load_config(dict(model="llama3-8b", hardware=dict(n_nodes=1), layout=dict(tp=8, sequence_parallel=True),
                           train=dict(seq_len=8192, global_batch_seqs=2, stack="megatron-te", precision="fp8",
                                      fp8_recipe="current")))
    block = build_block(run.model, run.layout, run.train)
    for segs in (block.layer_forward(), block.layer_backward()):
        amax = [i for i, s in enumerate(segs) if isinstance(s, Comm) and s.size_bytes == AMAX_BYTES]
        assert len(amax) == 2
        assert all(isinstance(segs[i + 1], Comm) and segs[i + 1].coll.kind == "all_gather" for i in amax)  # type: ignore[union-attr]
