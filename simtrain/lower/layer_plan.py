"""What lowering plans per layer and per chunk before it emits anything: which layers each pipeline stage and
chunk holds, each layer's kernels and saved bytes (LayerPlan), a chunk's memory, micro-batch counts,
the embedding-sync and pipeline-runtime bytes, and the block builder for a layout."""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.lower.blocks import (
    BlockBuilder,
    Segment,
)
from simtrain.lower.emit import EdgeSegments, per_step
from simtrain.lower.kernels import KernelDesc
from simtrain.lower.memory import (
    ActivationShape,
    ChunkMemory,
    activation_shape,
    backward_transient_bytes,
    layer_activation_bytes,
    layer_checkpoint_bytes,
    mlp_intermediate_bytes,
    op_sac_activation_bytes,
    pipeline_stage_buffer_bytes,
    torch_cp_backward_transient_bytes,
    weight_grad_input_bytes,
)
from simtrain.lower.nvfp4 import NVFP4_SAVED_INPUT_SHARE
from simtrain.lower.offload import sync_layers
from simtrain.lower.stack_rules import (
    fp8_amax_casts,
    tp_overlap_on,
)
from simtrain.plan.schedules import Route, RouteShape, schedule_of
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.spec.model import ModelSpec
from simtrain.spec.stacks import SoftwareStack


def layers_by_position(n_layers: int, positions: int) -> list[int]:
    """Layers of each model stage (position on the pipeline path). Even when divisible; otherwise the
    first and last positions give up layers first, since they also hold the embedding and the LM head
    (Llama 3 405B removes one layer from each of them; Dubey et al. 2024 sec. 3.3.2; Megatron
    ``--decoder-first/last-pipeline-num-layers``)."""
    if n_layers % positions == 0:
        return [n_layers // positions] * positions
    base = -(-n_layers // positions)
    counts = [base] * positions
    deficit = positions * base - n_layers
    order = [i for pair in zip(range(positions), reversed(range(positions)), strict=True) for i in pair]
    for i in order[:deficit] if deficit <= positions else order:
        counts[i] -= 1
    return counts


def split_layers(n_layers: int, pp: int, vpp: int, route: Route | None = None) -> list[list[int]]:
    """Layers per (stage, chunk): the positions of ``route`` (default: Megatron's virtual stages,
    position = chunk * pp + stage) each get ``layers_by_position``'s share."""
    route = route or Route(RouteShape.INTERLEAVED, pp, vpp)
    counts = layers_by_position(n_layers, route.length)
    chunks = route.v  # chunks per stage: vpp, or 2 for DualPipe's and DualPipeV's routes
    return [[counts[route.position(0, s, c)] for c in range(chunks)] for s in range(pp)]


@dataclass(slots=True)
class LayerPlan:
    """Per-layer costs and memory deltas shared by every layer of the model."""

    fwd: list[Segment]
    bwd: list[Segment]
    act_bytes: float
    ckpt_bytes: float
    transient_bytes: float
    params_per_rank: float
    selective: list[Segment] = field(default_factory=list)
    """What selective recompute re-runs before the layer's backward (kernels, and under op-level SAC
    with TP the collectives its save list leaves out)."""
    expert_params_per_rank: float = 0.0
    """Routed-expert parameters of the layer on this rank (sharded by ep x etp, reduced over edp)."""
    bwd_input: list[Segment] = field(default_factory=list)
    """Backward without the weight-gradient GEMMs (zero-bubble "B", Qi et al. 2023 sec. 2)."""
    bwd_weight: tuple[KernelDesc, ...] = ()
    """The weight-gradient GEMMs alone (zero-bubble "W")."""
    weight_bytes: float = 0.0
    """Activations a split backward keeps from B until W: the linear layers' inputs."""
    recompute_bytes: float = 0.0
    """Activations ``selective`` rebuilds before the layer's backward (op-level SAC: what it did
    not save), allocated when they run and freed with the layer's backward."""


def embedding_sync_bytes(model: ModelSpec, layout: LayoutConfig, train: TrainConfig, held: set[int], n_virtual: int,
                         stack: SoftwareStack) -> float:
    """Bytes of the embedding-gradient all-reduce a rank holding virtual stages ``held`` runs after its
    gradient reductions and before the optimizer step (0 where it runs none).

    Megatron-core's ``finalize_model_grads._allreduce_word_embedding_grads`` all-reduces the main
    gradient of the input embedding (V x h / tp, in the gradient dtype) between the first and the last
    pipeline stage when the LM head is tied to it or MTP shares it (``mtp_num_layers``), blocking;
    DeepSpeed's pipeline engine does the same for its tied modules (``_exec_reduce_tied_grads``, the
    fp32 high-precision gradient). Nothing crosses stages when one rank holds both ends (V-shaped
    schedules) or the model shares no embedding; ``torch.distributed.pipelining`` keeps no embedding
    group (each stage owns its parameters).
    """
    if layout.pp == 1 or stack.torch_pipelining or not (model.tied_embeddings or model.mtp_depth > 0):
        return 0.0
    if (0 in held) == (n_virtual - 1 in held):
        return 0.0
    grad_b = train.grad_bytes
    return grad_b * model.embedding_params() / layout.tp


def _layer_plan(run: RunConfig, block: BlockBuilder, layer: int) -> LayerPlan:
    """Costs and memory of global layer ``layer`` (dense or MoE) on one rank."""
    shape = activation_shape(run.train, run.layout, run.model)
    modules = run.layout.recompute_modules if run.layout.recompute == "selective" else ()
    selective = "core_attn" in modules and not shape.flash
    m, lay = run.model, run.layout
    experts = m.layer_routed_expert_params(layer) if m.is_moe else 0
    etp = lay.expert_tp
    w_in = weight_grad_input_bytes(m, shape, layer)
    act = layer_activation_bytes(m, shape, recompute_attention=selective, layer=layer, recompute=modules)
    kernels = block.selective_recompute(layer, modules)
    recompute: list[Segment] = [kernels] if kernels else []
    rebuilt = 0.0
    if lay.recompute == "op_sac":
        # torchtitan op-level SAC: its saved tensors, and the rest rebuilt before the layer's backward
        # (bounded by what the layer keeps without recompute); FP8 saves matmul outputs in BF16 there
        full, act = act, op_sac_activation_bytes(m, shape, layer, compiled=run.train.stack_spec.compiled_blocks)
        recompute, rebuilt = block.op_sac_recompute(layer), max(full - act, 0.0)
        w_in = min(w_in, act)
    elif run.train.precision == "fp8":
        # linear-layer inputs are saved as their FP8 casts for backward (Transformer Engine saves the
        # quantised input; DeepSeek-V3 sec. 3.3.3 caches activations in FP8): half of their BF16 bytes
        act, w_in = act - 0.5 * w_in, 0.5 * w_in
    elif run.train.precision == "fp4":
        # NVFP4: TE keeps only the input's column-wise NVFP4 copy (the wgrad operand) (simtrain.lower.nvfp4)
        act, w_in = act - (1.0 - NVFP4_SAVED_INPUT_SHARE) * w_in, NVFP4_SAVED_INPUT_SHARE * w_in
    bwd = block.layer_backward(layer)
    bwd_input = [seg if not isinstance(seg, tuple) else tuple(k for k in seg if not k.name.endswith(".wgrad"))
                 for seg in bwd]
    bwd_weight = tuple(k for seg in bwd if isinstance(seg, tuple) for k in seg if k.name.endswith(".wgrad"))
    return LayerPlan(
        fwd=block.layer_forward(layer), bwd=bwd, bwd_input=[seg for seg in bwd_input if seg], bwd_weight=bwd_weight,
        weight_bytes=w_in,
        act_bytes=act,
        ckpt_bytes=layer_checkpoint_bytes(m, shape),
        transient_bytes=_backward_transient(run, block, shape, layer),
        params_per_rank=(m.layer_params(layer) - experts) / lay.tp,
        selective=recompute,
        recompute_bytes=rebuilt if recompute else 0.0,
        expert_params_per_rank=experts / (lay.ep * etp),
    )


def _backward_transient(run: RunConfig, block: BlockBuilder, shape: ActivationShape, layer: int) -> float:
    """The largest buffers one layer's backward holds beside its saved activations: the MLP's gradient
    pair, or under torch's ring attention the CP buffers of the attention backward, which runs after the
    MLP's backward has freed the MLP intermediates (``memory.torch_cp_backward_transient_bytes``)."""
    m = run.model
    mlp = backward_transient_bytes(m, shape, layer)
    if not (block.torch_cp and block.cp_comm == "p2p") or run.layout.cp <= 1:
        return mlp
    ring = torch_cp_backward_transient_bytes(m, shape, run.layout.cp) - mlp_intermediate_bytes(m, shape, layer)
    return max(mlp, ring)


def layer_plans(run: RunConfig, block: BlockBuilder, n_layers: int) -> dict[int, LayerPlan]:
    """Plans of layers 0..n_layers-1, built once per distinct layer structure (dense/MoE, window)."""
    m = run.model
    by_kind: dict[tuple[bool, int | None], LayerPlan] = {}
    out = {}
    for i in range(n_layers):
        key = (m.is_moe_layer(i), m.attention_window(i))
        if key not in by_kind:
            by_kind[key] = _layer_plan(run, block, i)
        out[i] = by_kind[key]
    return out


def chunk_memory(plans: list[LayerPlan], v: int, last: int, layout: LayoutConfig,
                  edges: tuple[float, float, float], mtp: list[LayerPlan],
                  steps: EdgeSegments | None = None) -> ChunkMemory:
    """Ledger deltas of one chunk, as the emitters above attach them (its forward, backward, split
    backward B and W; MTP blocks and the loss on the last position ``last``), for the closed-form
    peak (``memory.closed_form_peak``) and layout search's estimate. ``plans``: the chunk's layers in
    order; ``edges``: embedding, head and loss-transient bytes. With ``steps`` (the embedding's and
    head's segments), one entry per emission step (``segment_marks``, zeros where a step carries no
    delta): DualPipe's overlapped pairs interleave their chains step by step, and a layer of several
    compute segments allocates on its first and frees on its last, so entries per layer would pair the
    two chains' deltas differently from the ledger (2-3 % of the peak under TP or EP). Without it,
    one entry per delta-carrying op (enough for a sequential walk)."""
    emb, head, loss = edges
    ov = steps.tp_overlap if steps is not None else None

    def seg(segs: list[Segment], start: float, end: float) -> list[tuple[float, float]]:
        return per_step(segs, ov, start, end)

    def edge(name: str, start: float, end: float) -> list[tuple[float, float]]:
        return [(start, end)] if steps is None else seg(getattr(steps, name), start, end)

    mem = ChunkMemory()
    rec = recomputed_layers(layout, len(plans))
    if v == 0:
        mem.fwd += edge("embedding_fwd", emb, 0.0)
    offload = layout.offload_activation_layers
    sync = {w: k for k, w in enumerate(sync_layers(len(plans), offload))} if offload else {}
    for j, p in enumerate(plans):
        mem.fwd += seg(p.fwd, p.act_bytes, -(p.act_bytes - p.ckpt_bytes) if j < rec else 0.0)
        if j in sync:  # the wait for offload copy k frees layer k's GPU copy (``_Offload``)
            mem.fwd.append((-plans[sync[j]].act_bytes, 0.0))
    if v == last:
        mem.fwd += edge("head_fwd", head, 0.0)
        for p in mtp:
            mem.fwd += seg(p.fwd, p.act_bytes, 0.0) + edge("head_fwd", head, 0.0)
        for p in reversed(mtp):
            tail = edge("head_bwd", 0.0, -head) + seg(p.bwd, p.transient_bytes, -(p.act_bytes + p.transient_bytes))
            mem.bwd += tail
            mem.bwd_input += tail
        mem.bwd += edge("head_bwd", loss, -head - loss)
        mem.bwd_input += edge("head_bwd", loss, -head - loss)
    selective = layout.recompute in ("selective", "op_sac")
    for j in reversed(range(len(plans))):
        p = plans[j]
        again = j < rec
        if j in sync:  # layer k's buffers are allocated again when its reload starts
            mem.bwd.append((plans[sync[j]].act_bytes, 0.0))
            mem.bwd_input.append((plans[sync[j]].act_bytes, 0.0))
        freed = (p.ckpt_bytes + p.act_bytes if again else p.act_bytes) + p.transient_bytes
        if again:
            mem.bwd += seg(p.fwd, p.act_bytes, 0.0)
            mem.bwd_input += seg(p.fwd, p.act_bytes, 0.0)
        elif p.selective and selective:
            mem.bwd += seg(p.selective, p.recompute_bytes, 0.0)
            mem.bwd_input += seg(p.selective, p.recompute_bytes, 0.0)
            freed += p.recompute_bytes
        mem.bwd += seg(p.bwd, p.transient_bytes, -freed)
        mem.bwd_input += seg(p.bwd_input, p.transient_bytes, -(freed - p.weight_bytes))
        mem.wgt.append((0.0, -p.weight_bytes))
    if v == 0:
        mem.bwd += edge("embedding_bwd", 0.0, -emb)
        mem.wgt += edge("embedding_bwd", 0.0, -emb)
    return mem


def recomputed_layers(layout: LayoutConfig, n_layers: int) -> int:
    """How many leading layers of a chunk of ``n_layers`` full recompute re-runs (``recompute_layers``)."""
    if layout.recompute != "full":
        return 0
    return n_layers if layout.recompute_layers is None else min(layout.recompute_layers, n_layers)


def microbatches(run: RunConfig) -> int:
    """Micro-batches per step per DP rank: global sequences / (micro-batch x dp)."""
    return run.train.global_batch_seqs_resolved // (run.train.micro_batch_size * run.layout.dp)


def pp_runtime_bytes(model: ModelSpec, lay: LayoutConfig, train: TrainConfig, positions: list[int], last: int,
                     microbatches: int) -> float:
    """Bytes the stack's pipeline runtime keeps on a stage (chunks at route ``positions``, the last
    at ``last``) for the whole step: torch pipelining's buffers (``memory.pipeline_stage_buffer_bytes``)
    under PP, nothing otherwise."""
    if lay.pp == 1 or not train.stack_spec.torch_pipelining:
        return 0.0
    shape = activation_shape(train, lay, model)
    return pipeline_stage_buffer_bytes(model, shape, positions, last, microbatches)


def build_block(model: ModelSpec, lay: LayoutConfig, train: TrainConfig) -> BlockBuilder:
    """The BlockBuilder of one micro-batch of this layout, precision and stack (lowering and the search
    estimate build the same one). Stack switches: ``fp8_tp_gather`` (tensorwise FP8 with sequence
    parallelism only), ``dtensor_tp``, ``torch_cp``."""
    shape = activation_shape(train, lay, model)
    stack = train.stack_spec
    sp = lay.sequence_parallel and lay.tp > 1
    tensorwise_sp = sp and train.precision == "fp8" and train.fp8_recipe == "current"
    return BlockBuilder(model, shape.b, shape.s, lay.tp, lay.sequence_parallel, shape.flash,
                        shape.dropout, lay.cp, lay.cp_comm, lay.ep, lay.expert_tp,
                        # DualPipe and DualPipeV overlap one chunk's dispatch/combine with the other's
                        # compute (deepseek-ai/DualPipe: dualpipe.py, dualpipev.py)
                        lay.ep_comm_overlap or schedule_of(lay.resolved_schedule).overlaps_forward_backward,
                        1.0 if train.precision == "fp8" and train.fp8_recipe == "blockwise" else 2.0,
                        amax_casts=fp8_amax_casts(stack, tensorwise_sp),
                        fp8_tp_gather=stack.fp8_tp_gather and tensorwise_sp,
                        dtensor_tp=stack.dtensor_tp, tp_overlap=tp_overlap_on(lay), torch_cp=stack.torch_cp,
                        expert_load=shape.expert_load, tp_async_grad_allreduce=stack.tp_async_grad_allreduce,
                        ep_dedup=ep_dedup(model, lay), probs_all_to_all=stack.moe_probs_all_to_all,
                        # TE's grouped linear pads FP8 experts by copies; fp8.weight_cache marks the TE stacks
                        fp8_expert_padding=train.precision == "fp8" and stack.fp8_expert_padding_copies)


def ep_dedup(model: ModelSpec, lay: LayoutConfig) -> bool:
    """Whether MoE dispatch sends a token once per remote node (``layout.ep_dispatcher``: deepep, or auto
    with node-limited routing)."""
    if lay.ep_dispatcher == "auto":
        return model.moe is not None and model.moe.group_limited
    return lay.ep_dispatcher == "deepep"


def first_layers(layers: list[list[int]], route: Route) -> list[list[int]]:
    """Global index of each (stage, chunk)'s first layer: layers run in path order (position).

    DualPipe holds the model twice, once per direction: chunk 0 of stage s and chunk 1 of stage p - 1 - s
    are the same position (deepseek-ai/DualPipe dualpipe.py), so each gets that position's first layer."""
    count_at = {route.position(0, s, c): n for s, row in enumerate(layers) for c, n in enumerate(row)}
    first_at, offset = {}, 0
    for pos in range(route.length):
        first_at[pos] = offset
        offset += count_at[pos]
    return [[first_at[route.position(0, s, c)] for c in range(len(row))] for s, row in enumerate(layers)]
