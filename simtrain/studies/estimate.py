"""Closed-form estimate of a step's time and per-stage peak memory, without the engine.

Used by the layout search to rank and prune thousands of layouts before simulating the best few.
It reuses the simulator's own cost pieces, so the two agree where the closed form is exact:

- layers: ``simtrain.lower.lowering``'s own per-layer plans (``layer_plans``: segments, activation,
  checkpoint and transient bytes, parameters per rank), one per distinct layer structure (dense or
  MoE MLP, full or sliding-window attention, the MTP block), so every layer of a chunk is costed
  as the engine costs it;
- compute: the kernels ``simtrain.lower.blocks`` builds for each layer, the embedding and the head at the
  layout's shape (GEMM tile/wave efficiency included), summed over the layers of each stage, plus
  the recomputed forwards; routed-expert kernels are scaled by the hottest EP rank's load
  (``simtrain.plan.routing``; 1 with balanced routing), as the engine scales them;
- TP/CP/EP/ETP/DP collectives: the (algorithm, protocol) NCCL would pick for the group's placement
  and its idle-network time (``simtrain.cost.collectives``): an EP group inside a node runs its
  dispatch/combine all-to-alls on NVLink, one spanning nodes is bound by the NICs, and
  group-limited routing (``moe.group_limited``) uses the node-limited all-to-all (DeepSeek-V3
  sec. 3.2.2); a collective the blocks mark as overlapped costs only what exceeds the compute
  segment beside it; PP sends: latency + bytes over the route;
- pipeline: 1F1B/interleaved: micro-batches x the slowest stage's micro-batch time, plus the
  fill/drain bubble (p - 1)/v x the mean stage time (Narayanan et al. 2021 sec. 2.2: bubble
  fraction (p - 1)/(v m)); ZB-H1, DualPipe and DualPipeV: ``simtrain.plan.schedules.makespan`` of the
  schedule itself with per-(stage, chunk) F, B, W costs (DualPipeV runs DualPipe's steps on p ranks
  holding 2p stages in a V, so it has DualPipe's bubble with one copy of the parameters:
  deepseek-ai/DualPipe README, "Pipeline Bubbles and Memory Usage Comparison"; both come out of the
  executed schedule and ``lowering.split_layers``; the overlapped F&B pairs cost their compute,
  their communication hidden by the other chain: DeepSeek-V3 sec. 3.2.1, Table 2), extrapolated
  linearly past the warm-up;
- DP overlap: the gradient reduction hides behind the last micro-batch's backward (Megatron DDP
  buckets), the ZeRO-1/2 parameter all-gather behind the first forward; routed-expert gradients
  reduce over the expert-data-parallel group (edp = tp x cp x dp / (ep x etp); Megatron-core's expert
  buckets, as ``lowering.BucketFiller``); ZeRO-3/FSDP: each action's per-layer gathers (dense part
  over dp x cp, routed experts over edp) and per-layer reduce-scatters timed on a small timeline of
  the gather and reduce-scatter streams sharing the links, with FSDP2's prefetch (``_fsdp_timeline``);
- memory: ``simtrain.lower.memory``'s static state (expert weights/grads/optimizer sharded by EP x ETP
  and ZeRO over edp, ``expert_static_memory``; FP8 weight copies) and the plans' per-op activation
  deltas walked over the stage's schedule, exactly as the engine's ledger attaches them (on a
  schedule cut to the micro-batches past which a 1F1B/interleaved peak no longer grows).

It ignores contention between concurrent flows, compute slowed by overlapped communication, and the
exact dependency timing; the search simulates its best candidates to get those right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.cost.collectives import (
    collective_candidates,
    effective_bandwidth,
    idle_time,
    plan_send,
    unit_idle_times,
)
from simtrain.cost.cost_pass import CostedSegment, cost_kernels, cost_segments
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import ClusterSpec
from simtrain.hardware.profile import compute_calibration
from simtrain.hardware.topology import Topology
from simtrain.lower.blocks import TP_OVERLAP_CHUNKS, Comm, Ring
from simtrain.lower.collective_kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Collective, CollectiveKind
from simtrain.lower.emit import EdgeSegments, edge_segments
from simtrain.lower.flops import model_flops_per_step
from simtrain.lower.layer_plan import (
    LayerPlan,
    build_block,
    chunk_memory,
    embedding_sync_bytes,
    first_layers,
    layer_plans,
    pp_runtime_bytes,
    recomputed_layers,
    split_layers,
)
from simtrain.lower.memory import (
    ChunkMemory,
    activation_shape,
    closed_form_peak,
    embedding_activation_bytes,
    expert_static_memory,
    fp8_weight_cache_bytes,
    head_activation_bytes,
    loss_backward_transient_bytes,
    static_memory,
)
from simtrain.lower.offload import stall_s
from simtrain.lower.stack_rules import (
    dp_overlaps,
    fp32_grad_accumulation_kernel,
    fsdp_keeps_unsharded,
    grad_reduce_collective,
    optimizer_bytes_per_param,
    tp_overlap_on,
)
from simtrain.plan.layout import RankGrid
from simtrain.plan.routing import worst_rank_load
from simtrain.plan.schedules import (
    schedule_of,
)
from simtrain.spec.config import LayoutConfig, TrainConfig
from simtrain.spec.model import ModelSpec
from simtrain.spec.stacks import StackOverride
from simtrain.studies.estimate_parts import (
    _chunk_cost,
    _ChunkCost,
    _EdgeTimes,
    _edp,
    _fsdp_timeline,
    _FsdpAction,
    _heaviest,
    _layer_run,
    _LayerTimes,
    _peak_microbatches,
    _Pipe,
    _pipeline_1f1b,
    _pipeline_scheduled,
    _plan_key,
    _schedule,
    _Structure,
    _tp_pipelined_s,
    single_chunk_peak,
)

MiB = 1024.0**2
EP_AXES = ("ep", "etp")


@dataclass(frozen=True, slots=True)
class Estimate:
    """Closed-form step estimate (seconds) and per-stage peak memory (bytes, fragmentation included)."""

    step_time_s: float
    compute_s: float
    bubble_s: float
    tp_s: float
    """Exposed TP and CP communication (both live inside the layer's segments)."""
    pp_s: float
    dp_s: float
    optimizer_s: float
    stage_peak_bytes: tuple[float, ...]
    capacity_bytes: float
    mfu: float
    ep_s: float = 0.0
    """Exposed MoE dispatch/combine (EP) and expert-TP communication."""

    @property
    def peak_bytes(self) -> float:
        """Largest stage peak, bytes."""
        return max(self.stage_peak_bytes)

    @property
    def fits(self) -> bool:
        """Every stage's peak fits in HBM."""
        return self.peak_bytes <= self.capacity_bytes

    def components(self) -> dict[str, float]:
        """Where the estimated time goes, seconds, by cause (compute, bubble, comm per axis, optimizer)."""
        return {"compute": self.compute_s, "bubble": self.bubble_s, "tp/cp comm": self.tp_s, "ep comm": self.ep_s,
                "pp comm": self.pp_s, "dp comm": self.dp_s, "optimizer": self.optimizer_s}


@dataclass(slots=True)
class Estimator:
    """Estimates layouts of one model on one cluster; caches per-shape and per-group costs."""

    model: ModelSpec
    cluster: ClusterSpec
    fragmentation_ratio: float = 0.05
    fabric: Fabric | None = None
    """The run's fabric (``simtrain.hardware.fabric.wiring.fabric_of``); None: the built-in one."""
    topo: Fabric = field(init=False)
    _colls: dict[tuple[Collective, tuple[int, ...]], tuple[tuple[float, float], ...]] = field(default_factory=dict)
    _costs: dict[tuple[str, str | StackOverride, str], ComputeCostModel] = field(default_factory=dict)
    _plans: dict[tuple[object, ...], dict[int, LayerPlan]] = field(default_factory=dict)
    _edge_segs: dict[tuple[object, ...], EdgeSegments] = field(default_factory=dict)
    _times: dict[tuple[object, ...], dict[int, _LayerTimes]] = field(default_factory=dict)
    _edges: dict[tuple[object, ...], _EdgeTimes] = field(default_factory=dict)
    _structs: dict[tuple[int, int, str], _Structure] = field(default_factory=dict)
    _params: dict[tuple[int, int, int], list[tuple[float, float]]] = field(default_factory=dict)
    _pipes: dict[tuple[object, ...], tuple[list[list[_ChunkCost]], _Pipe]] = field(default_factory=dict)
    _dynamic: dict[tuple[object, ...], tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.topo = self.fabric or Topology(self.cluster)

    # -- costs -----------------------------------------------------------------------------------
    def collective_s(self, kind: Collective, group: tuple[int, ...], size_bytes: float) -> float:
        """Time of one collective on ``group``: min over NCCL's candidates of latency + size x s/byte."""
        if len(group) < 2 or size_bytes <= 0:
            return 0.0
        key = (kind, group)
        lines = self._colls.get(key)
        if lines is None:
            gpu = self.cluster.gpu
            cands = collective_candidates(kind, group, self.topo, gpu)
            units = unit_idle_times(cands, lambda e: effective_bandwidth(self.topo, gpu, e))
            lines = self._colls[key] = tuple((c.latency_s, u) for c, u in zip(cands, units, strict=True))
        return min(lat + u * size_bytes for lat, u in lines)

    def _send_s(self, src: int, dst: int, size_bytes: float) -> float:
        plan = plan_send(src, dst, size_bytes, self.topo)
        gpu = self.cluster.gpu
        return plan.latency_s + idle_time(lambda e: effective_bandwidth(self.topo, gpu, e), plan.phases)

    def _segments_s(self, segs: list[CostedSegment], groups: dict[str, tuple[int, ...]],
                    load: float = 1.0, tp_overlap: bool = False) -> tuple[float, float, float]:
        """(compute, exposed TP/CP comm, exposed EP/ETP comm) of a segment list; an overlapped
        collective costs only what exceeds the compute segment it runs beside; routed-expert kernels
        take ``load`` x their time (the engine's ``load_factor``). With ``tp_overlap`` a TP collective
        pipelines with the GEMMs it is fused with, as the engine lowers it (``_tp_pipelined_s``)."""
        compute = comm = ep = 0.0
        hidden, hidden_ep = 0.0, False
        before: float | None = None  # a TP collective waiting to pipeline with the next compute segment
        skip = -1
        for i, s in enumerate(segs):
            if i == skip:
                continue
            if isinstance(s, Ring):
                # ring attention: block i+1 waits for KV block i's transfer, which runs beside block i
                block = sum(k.time_s for k in s.kernels)
                hop = 0.0 if s.comm is None else self.collective_s(s.comm.coll, groups.get(s.comm.axis, ()),
                                                                    s.comm.size_bytes)
                compute += s.steps * block
                comm += (s.steps - 1) * max(hop - block, 0.0)
                if hidden:  # a collective overlapped with the first block only (torch's KV all-gather)
                    comm += max(hidden - block, 0.0)
                    hidden = 0.0
            elif isinstance(s, Comm):
                if s.fused_with_gemm(tp_overlap):
                    comm += before or 0.0  # two in a row: the first one cannot pipeline
                    before = self._tp_chunks_s(s, groups)
                    continue
                t = self.collective_s(s.coll, groups.get(s.axis, ()), s.size_bytes)
                if s.overlap:
                    hidden, hidden_ep = t, s.axis in EP_AXES
                elif s.axis in EP_AXES:
                    ep += t
                else:
                    comm += t
            else:
                t = sum(k.time_s + (load - 1.0) * k.time_s * k.name.startswith("expert.") for k in s)
                compute += t
                nxt = segs[i + 1] if i + 1 < len(segs) else None
                after = None
                if (isinstance(nxt, Comm) and nxt.fused_with_gemm(tp_overlap)
                        and nxt.coll.kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE)):
                    after, skip = self._tp_chunks_s(nxt, groups), i + 1
                if before is not None or after is not None:
                    comm += _tp_pipelined_s(s, before, after)
                    before = None
                if hidden_ep:
                    ep += max(hidden - t, 0.0)
                else:
                    comm += max(hidden - t, 0.0)
                hidden = 0.0
        comm += before or 0.0
        if hidden_ep:
            return compute, comm, ep + hidden
        return compute, comm + hidden, ep

    def _tp_chunks_s(self, c: Comm, groups: dict[str, tuple[int, ...]]) -> float:
        """A TP collective run as ``TP_OVERLAP_CHUNKS`` chunks (the engine's TP comm overlap), seconds."""
        return TP_OVERLAP_CHUNKS * self.collective_s(c.coll, groups.get("tp", ()), c.size_bytes / TP_OVERLAP_CHUNKS)

    def cost_model(self, train: TrainConfig) -> ComputeCostModel:
        """The compute cost model ``simulate`` uses for this GPU and train section (calibrated when
        the profile is; the run's software stack and FP8 recipe)."""
        key = (train.precision, train.stack, train.fp8_recipe)
        hit = self._costs.get(key)
        if hit is None:
            gpu = self.cluster.gpu
            hit = self._costs[key] = ComputeCostModel(gpu, train.precision, calibration=compute_calibration(gpu),
                                                      stack=train.stack_spec, fp8_recipe=train.fp8_recipe)
        return hit

    def plans(self, layout: LayoutConfig, train: TrainConfig) -> dict[int, LayerPlan]:
        """Lowering's plan of every layer (main layers, then MTP blocks), one per distinct structure."""
        key = _plan_key(self.model, layout, train)
        hit = self._plans.get(key)
        if hit is None:
            block = build_block(self.model, layout, train)
            run = _layer_run(self.model, layout, train)
            hit = self._plans[key] = layer_plans(run, block, self.model.n_layers + self.model.mtp_depth)
            self._edge_segs[key] = edge_segments(block, layout)
        return hit

    def edges(self, layout: LayoutConfig, train: TrainConfig) -> EdgeSegments:
        """The embedding's and head's segments lowering emits (``chunk_memory``'s emission steps)."""
        self.plans(layout, train)
        return self._edge_segs[_plan_key(self.model, layout, train)]

    def _groups(self, grid: RankGrid) -> dict[str, tuple[int, ...]]:
        """Rank 0's process groups of the axes a layer communicates on."""
        axes = ("tp", "cp", "ep", "etp") if self.model.is_moe else ("tp", "cp")
        return {axis: grid.group(axis, 0) for axis in axes}

    def _load(self, layout: LayoutConfig, train: TrainConfig) -> float:
        """The hottest EP rank's routed load (what the engine charges every rank in symmetric mode)."""
        return worst_rank_load(self.model, train, layout)

    def layer_times(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid) -> dict[int, _LayerTimes]:
        """Per-micro-batch times of every layer (by global index) at this layout's shape (cached)."""
        plans = self.plans(layout, train)
        groups = self._groups(grid)
        load = self._load(layout, train)
        key = (_plan_key(self.model, layout, train), tuple(groups.values()), load)
        hit = self._times.get(key)
        if hit is not None:
            return hit
        by_plan: dict[int, _LayerTimes] = {}
        for plan in plans.values():
            if id(plan) not in by_plan:
                by_plan[id(plan)] = self._plan_times(plan, groups, load, tp_overlap_on(layout), self.cost_model(train))
        out = self._times[key] = {i: by_plan[id(p)] for i, p in plans.items()}
        return out

    def _plan_times(self, plan: LayerPlan, groups: dict[str, tuple[int, ...]], load: float,
                    tp_overlap: bool, cost: ComputeCostModel) -> _LayerTimes:
        f, f_comm, f_ep = self._segments_s(cost_segments(plan.fwd, cost), groups, load, tp_overlap)
        b, b_comm, b_ep = self._segments_s(cost_segments(plan.bwd, cost), groups, load, tp_overlap)
        wgrad = sum(k.time_s * (load if k.name.startswith("expert.") else 1.0)
                    for k in cost_kernels(plan.bwd_weight, cost))
        selective = sum(self._segments_s(cost_segments(plan.selective, cost), groups, load, tp_overlap))
        return _LayerTimes(f, b, f_comm, b_comm, f_ep, b_ep, wgrad, selective)

    def edge_times(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid) -> _EdgeTimes:
        """Embedding, head and MTP-projection times of one micro-batch (cached)."""
        groups = {"tp": grid.group("tp", 0)}
        key = (activation_shape(train, layout, self.model), train.precision, train.stack, train.fp8_recipe,
               groups["tp"], layout.tp_comm_overlap)
        hit = self._edges.get(key)
        if hit is not None:
            return hit
        blk, cost = build_block(self.model, layout, train), self.cost_model(train)
        emb = sum(self._segments_s(cost_segments(blk.embedding_forward() + blk.embedding_backward(), cost), groups,
                                   tp_overlap=blk.tp_overlap))
        head = sum(self._segments_s(cost_segments(blk.head_forward() + blk.head_backward(), cost), groups,
                                    tp_overlap=blk.tp_overlap))
        proj_f = cost.kernel_time(blk.mtp_projection(False)[0]) if self.model.mtp_depth else 0.0
        proj_b = sum(k.time_s for k in cost_kernels(blk.mtp_projection(True), cost)) if self.model.mtp_depth else 0.0
        out = self._edges[key] = _EdgeTimes(emb, head, proj_f, proj_b)
        return out

    def structure(self, layout: LayoutConfig) -> _Structure:
        """Route and layer placement of the layout's schedule (cached)."""
        kind = layout.resolved_schedule
        key = (layout.pp, layout.vpp, kind)
        hit = self._structs.get(key)
        if hit is None:
            route = schedule_of(kind).route(layout.pp, 0, layout.vpp)
            layers = split_layers(self.model.n_layers, layout.pp, layout.vpp, route)
            hit = self._structs[key] = _Structure(route, layers, first_layers(layers, route))
        return hit

    def chunk_layers(self, layout: LayoutConfig) -> list[list[int]]:
        """Layers of each (stage, chunk) of the layout's schedule."""
        return self.structure(layout).layers

    # -- memory ----------------------------------------------------------------------------------
    def _mtp_plans(self, plans: dict[int, LayerPlan]) -> list[LayerPlan]:
        n = self.model.n_layers
        return [plans[n + k] for k in range(self.model.mtp_depth)]

    def layer_params(self, layout: LayoutConfig) -> list[tuple[float, float]]:
        """(dense, routed-expert) parameters of every layer (main, then MTP) on one rank, as
        ``lowering._layer_plan`` shards them: dense part / tp, routed experts / (ep x etp)."""
        m = self.model
        key = (layout.tp, layout.ep, layout.expert_tp)
        hit = self._params.get(key)
        if hit is None:
            kinds: dict[bool, tuple[float, float]] = {}
            hit = []
            for i in range(m.n_layers + m.mtp_depth):
                moe = m.is_moe_layer(i)
                if moe not in kinds:
                    experts = m.layer_routed_expert_params(i) if m.is_moe else 0
                    kinds[moe] = ((m.layer_params(i) - experts) / layout.tp, experts / (layout.ep * key[2]))
                hit.append(kinds[moe])
            self._params[key] = hit
        return hit

    def stage_params(self, layout: LayoutConfig) -> list[tuple[float, float, float]]:
        """Per stage, on one rank: (dense parameters incl. embedding/head/MTP, routed-expert
        parameters, transformer-layer parameters), as ``lowering`` places them."""
        return [(sum(c[0] for c in row), sum(c[1] for c in row), sum(c[2] for c in row))
                for row in self.chunk_params(layout)]

    def chunk_params(self, layout: LayoutConfig) -> list[list[tuple[float, float, float]]]:
        """``stage_params`` per (stage, chunk)."""
        m, tp = self.model, layout.tp
        per_layer, st = self.layer_params(layout), self.structure(layout)
        mtp = per_layer[m.n_layers:]
        last = st.route.length - 1
        out = []
        for s, chunks in enumerate(st.layers):
            row = []
            for c in range(len(chunks)):
                dense = expert = layer = 0.0
                for i in st.chunk(s, c):
                    d, e = per_layer[i]
                    dense, expert, layer = dense + d, expert + e, layer + d + e
                v = st.position(s, c)
                if v == 0:
                    dense += (m.embedding_params() + m.position_params()) / tp
                if v == last:
                    head = m.lm_head_params() or (m.embedding_params() if last > 0 else 0)
                    dense += head / tp + m.final_norm_params() + sum(d for d, _ in mtp)
                    dense += m.mtp_depth * (2 * m.hidden * m.hidden / tp + 3 * m.hidden)
                    expert += sum(e for _, e in mtp)
                row.append((dense, expert, layer))
            out.append(row)
        return out

    def static_memory(self, layout: LayoutConfig, train: TrainConfig) -> tuple[float, ...]:
        """Bytes each stage holds for the whole step (weights, grads, optimizer, buffers, context;
        ``simulate._attach_static_memory``), without fragmentation: a lower bound of its peak that
        needs no layer plan (the search prunes with it first)."""
        m = self.model
        layers = self.structure(layout).layers
        shard = layout.fsdp_shard_size if layout.fsdp == "hybrid" and layout.fsdp_shard_size else layout.data_degree
        edp = _edp(layout)
        context = self.cluster.gpu.cuda_context_bytes + self.cluster.gpu.nccl_buffer_bytes
        max_layer = max(d + e for d, e in self.layer_params(layout))
        out = []
        for s, (dense, expert, layer) in enumerate(self.stage_params(layout)):
            kept = layer if fsdp_keeps_unsharded(layout, train.stack_spec) else 0.0
            static = static_memory(dense, max_layer, sum(layers[s]), layout, train, shard, context, kept,
                                   dense + expert - layer)
            static["fp8_weights"] = fp8_weight_cache_bytes(layer, layout, train, shard)
            if expert and m.is_moe:
                for k, v in expert_static_memory(expert, layout, train, edp).items():
                    static[k] += v
            out.append(sum(static.values()))
        return tuple(out)

    def stage_memory(self, layout: LayoutConfig, train: TrainConfig, microbatches: int) -> tuple[float, ...]:
        """Peak bytes of each stage, fragmentation included (``simulate``'s static memory with the
        pipeline runtime's buffers, plus the ledger's activation peak)."""
        dynamic = self.dynamic_peaks(layout, train, microbatches)
        st = self.structure(layout)
        last = st.route.length - 1
        runtime = [pp_runtime_bytes(self.model, layout, train, [st.position(s, c) for c in range(len(st.layers[s]))],
                                    last, microbatches) for s in range(layout.pp)]
        return tuple((static + runtime[s] + dynamic[s]) * (1 + self.fragmentation_ratio)
                     for s, static in enumerate(self.static_memory(layout, train)))

    def dynamic_peaks(self, layout: LayoutConfig, train: TrainConfig, microbatches: int) -> tuple[float, ...]:
        """Peak activation/backward bytes per stage (independent of ZeRO, so cached without it)."""
        kind = layout.resolved_schedule
        mb = _peak_microbatches(layout, microbatches)
        key = (_plan_key(self.model, layout, train), layout.pp, layout.vpp, kind, layout.recompute,
               layout.recompute_layers, layout.offload_activation_layers, mb)
        hit = self._dynamic.get(key)
        if hit is not None:
            return hit
        chunks = self._chunk_memories(layout, train)
        # micro-batches in flight per stage in closed form (GPipe, 1F1B), else walk the action lists
        in_flight = [schedule_of(kind).in_flight(layout.pp, s, microbatches) for s in range(layout.pp)]
        if None in in_flight:
            schedule = _schedule(kind, layout.pp, mb, layout.vpp)
            out = [closed_form_peak(schedule[s], chunks[s]) for s in range(layout.pp)]
        else:
            out = [single_chunk_peak(chunks[s][0], n) for s, n in enumerate(in_flight) if n is not None]
        result = self._dynamic[key] = tuple(out)
        return result

    def _chunk_memories(self, layout: LayoutConfig, train: TrainConfig) -> list[dict[int, ChunkMemory]]:
        """Ledger deltas of every (stage, chunk), as lowering attaches them to ops."""
        m = self.model
        plans, st = self.plans(layout, train), self.structure(layout)
        shape = activation_shape(train, layout, m)
        stack = train.stack_spec
        edges = (embedding_activation_bytes(m, shape), head_activation_bytes(m, shape),
                 loss_backward_transient_bytes(m, shape, stack.eager_loss, loss_parallel=stack.dtensor_tp))
        last = st.route.length - 1
        mtp = self._mtp_plans(plans)
        steps = self.edges(layout, train)
        return [{c: chunk_memory([plans[i] for i in st.chunk(s, c)], st.position(s, c), last, layout, edges, mtp,
                                 steps)
                 for c in range(len(st.layers[s]))} for s in range(layout.pp)]

    # -- time ------------------------------------------------------------------------------------
    def estimate(self, layout: LayoutConfig, train: TrainConfig) -> Estimate:
        """Estimate one step of a valid layout (see the module docstring for the model)."""
        grid = RankGrid(layout)
        seqs = train.global_batch_seqs_resolved
        m = seqs // (train.micro_batch_size * layout.dp)
        costs, pipe = self._pipeline(layout, train, grid, m)
        compute, bubble, tp_s, ep_s, fwd_mb, bwd_mb = pipe
        pp_s = self._pp_s(layout, grid, train, m)
        params = _heaviest(self.stage_params(layout))
        groups = self._dp_groups(layout, grid)
        if layout.shard_stage >= 3:
            dp_s = self._zero3_s(layout, train, grid, m, costs)
        else:
            dp_s = max(self._dp_s(layout, train, groups, d, e, m, fwd_mb, bwd_mb, costs) for d, e in params)
        opt_s = max(self._optimizer_s(layout, train, d, e) for d, e in params)
        pp_s += self._embedding_sync_s(layout, train, grid)
        step = compute + bubble + pp_s + dp_s + opt_s
        tokens = seqs * train.seq_len
        flops = model_flops_per_step(self.model, train.seq_len, tokens)
        peak = self.cluster.gpu.bf16_flops_per_s  # MFU against the dense BF16 peak, as simulate reports it
        mem = self.stage_memory(layout, train, m)
        return Estimate(step, compute - tp_s - ep_s, bubble, tp_s, pp_s, dp_s, opt_s, mem, self.cluster.gpu.hbm_bytes,
                        flops / (step * self.cluster.n_gpus * peak), ep_s)

    def _pipeline(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid,
                  m: int) -> tuple[list[list[_ChunkCost]], _Pipe]:
        """Chunk costs and the pipeline's (compute, bubble, TP/CP comm, EP comm, forward and backward
        per micro-batch); cached, as ZeRO stages share them."""
        kind = layout.resolved_schedule
        key = (_plan_key(self.model, layout, train), tuple(self._groups(grid).values()), self._load(layout, train),
               layout.pp, layout.vpp, kind, layout.recompute, layout.recompute_layers,
               layout.offload_activation_layers, m)
        hit = self._pipes.get(key)
        if hit is None:
            costs = self._chunk_costs(layout, train, grid)
            if schedule_of(kind).uniform_bubble:
                hit = self._pipes[key] = (costs, _pipeline_1f1b(layout, costs, m))
            else:
                hit = self._pipes[key] = (costs, _pipeline_scheduled(layout, schedule_of(kind), costs, m))
        return hit

    def _chunk_costs(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid) -> list[list[_ChunkCost]]:
        """One micro-batch's cost of every (stage, chunk): its layers, embedding, head and MTP blocks."""
        times = self.layer_times(layout, train, grid)
        edge = self.edge_times(layout, train, grid)
        st = self.structure(layout)
        last = st.route.length - 1
        mtp = [times[self.model.n_layers + k] for k in range(self.model.mtp_depth)]
        costs = [[_chunk_cost([times[i] for i in st.chunk(s, c)], st.position(s, c), last, layout, edge, mtp)
                  for c in range(len(st.layers[s]))] for s in range(layout.pp)]
        stack, cost = train.stack_spec, self.cost_model(train)
        for row, params in zip(costs, self.chunk_params(layout), strict=True):
            for cc, (dense, expert, _) in zip(row, params, strict=True):
                kernel = fp32_grad_accumulation_kernel(layout, train, stack, dense + expert)
                if kernel is not None:  # as lowering adds it to each chunk's backward
                    cc.bwd_s += cost.kernel_time(kernel)
        if layout.offload_activation_layers:  # pp = 1: one chunk; waits for the offload/reload copies
            self._offload_stalls(costs[0][0], list(st.chunk(0, 0)), times, layout, train)
        return costs

    def _offload_stalls(self, cc: _ChunkCost, layers: list[int], times: dict[int, _LayerTimes],
                        layout: LayoutConfig, train: TrainConfig) -> None:
        """Add the compute stream's waits for CPU activation offload (forward) and reload (backward)
        copies of the chunk's ``layers`` to one micro-batch's chunk cost (``simtrain.lower.offload.stall_s``:
        each copy against the compute of its window of layers)."""
        plans = self.plans(layout, train)
        act = [plans[i].act_bytes for i in layers]
        n, host = layout.offload_activation_layers, self.cluster.node.host_link_Bps
        cc.fwd_s += stall_s([times[i].fwd_total_s for i in layers], act, host, n)
        cc.bwd_s += stall_s([times[i].bwd_total_s for i in layers], act, host, n)

    def _pp_s(self, layout: LayoutConfig, grid: RankGrid, train: TrainConfig, m: int) -> float:
        """Exposed pipeline sends: one activation/gradient transfer per virtual micro-batch boundary."""
        if layout.pp == 1:
            return 0.0
        size = 2.0 * train.micro_batch_size * (train.seq_len // layout.cp) * self.model.hidden / layout.tp
        peer = grid.group("pp", 0)[1]
        return (m * layout.vpp + layout.pp - 1) * self._send_s(0, peer, size)

    def _embedding_sync_s(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid) -> float:
        """The blocking embedding-gradient all-reduce between the first and last stage
        (``lowering.embedding_sync_bytes``), on rank 0's stage."""
        st = self.structure(layout)
        held = {st.position(0, c) for c in range(len(st.layers[0]))}
        size = embedding_sync_bytes(self.model, layout, train, held, st.route.length, train.stack_spec)
        return self.collective_s(ALL_REDUCE, grid.group("pp_emb", 0), size) if size > 0 else 0.0

    def _dp_groups(self, layout: LayoutConfig, grid: RankGrid) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Rank 0's data-parallel group (dp, or dp x cp: grads and ZeRO span both) and its
        expert-data-parallel group (empty for a dense model)."""
        group = grid.group(layout.data_axis, 0) if layout.data_degree > 1 else (0,)
        egroup = grid.group("edp", 0) if self.model.is_moe and _edp(layout) > 1 else ()
        return group, egroup

    def _dp_s(self, layout: LayoutConfig, train: TrainConfig, groups: tuple[tuple[int, ...], tuple[int, ...]],
              params: float, experts: float, m: int, fwd_mb: float, bwd_mb: float,
              costs: list[list[_ChunkCost]]) -> float:
        """Exposed data-parallel communication (gradient reduction, parameter gathers): dense
        parameters over dp (x cp), routed-expert parameters over the expert-data-parallel group."""
        group, egroup = groups
        if len(group) < 2 and len(egroup) < 2:
            return 0.0
        grad_b = train.grad_bytes
        stage = layout.shard_stage
        bucket = layout.grad_bucket_MiB * MiB
        chunks = len(costs[0])
        stack = train.stack_spec
        coll = grad_reduce_collective(layout, stack)
        overlap_reduce, overlap_gather = dp_overlaps(layout, stack)
        reduce_s = (self._bucketed_s(coll, group, grad_b * params, bucket)
                    + self._bucketed_s(coll, egroup, grad_b * experts, bucket))
        last = self.collective_s(coll, group, min(bucket, grad_b * params))
        if not overlap_reduce:
            exposed = reduce_s
        elif chunks > 1 and stage != 2:
            # Interleaved (and DualPipe's/DualPipeV's two chunks): each chunk reduces as its last
            # backward ends; only the last chunk's share (1/v) has no backward left to hide behind.
            exposed = reduce_s / chunks + last
        elif stage == 2:
            # ZeRO-2 reduce-scatters every micro-batch; nothing waits for it before the optimizer, so
            # it hides behind all the compute after the first backward.
            exposed = max(m * reduce_s - (m * (fwd_mb + bwd_mb) - fwd_mb), 0.0) + last
        else:
            exposed = max(reduce_s - bwd_mb, 0.0) + last
        if stage in (1, 2):
            gather_s = (self._bucketed_s(ALL_GATHER, group, 2.0 * params, bucket)
                        + self._bucketed_s(ALL_GATHER, egroup, 2.0 * experts, bucket))
            # Lowering issues every chunk's gather at the start and a chunk's first forward waits for
            # its own share: interleaved, the first chunk's 1/v is exposed and the rest hides behind
            # earlier chunks; otherwise the gather mostly overlaps the first forward (calibrated
            # against the engine).
            if not overlap_gather:
                exposed += gather_s
            else:
                exposed += gather_s / layout.vpp if layout.vpp > 1 else max(gather_s - fwd_mb, 0.0)
        return exposed

    def _zero3_s(self, layout: LayoutConfig, train: TrainConfig, grid: RankGrid, m: int,
                 costs: list[list[_ChunkCost]]) -> float:
        """ZeRO-3/FSDP: exposed parameter gathers and gradient reduce-scatters, as lowering emits them
        (``_StageLowering._fsdp_gather`` / ``_fsdp_reduce``, after FSDP2's prefetch).

        A stack that keeps a pipeline stage unsharded (``stack_rules.fsdp_keeps_unsharded``: torchtitan
        under PP) gathers each layer once, in the first forward, and reduce-scatters everything after
        the stage's last backward, fully exposed. Otherwise every forward and backward action gathers
        each of its layers again: the dense part over the
        data group (dp x cp; the shard group with hybrid FSDP) and, for an MoE layer, its routed experts
        (already sharded by EP x ETP) over the expert-data-parallel group, one after the other on the
        gather stream; after each layer's backward its dense and routed-expert gradients are
        reduce-scattered over the same two groups on the DP stream. ``_fsdp_timeline`` runs a stage's
        actions back to back with those rules (the two streams sharing the links), over two and three
        rounds of every chunk's forward and backward, and extrapolates the steady increment to the
        micro-batches each chunk runs (a DualPipe chunk m/2, the others m). The step pays the slowest
        stage's compute plus its exposure."""
        lay = layout
        if lay.data_degree == 1 and _edp(lay) == 1:
            return 0.0
        grad_b = train.grad_bytes
        dense_axis = "dp_shard" if lay.fsdp == "hybrid" and lay.fsdp_shard_size else lay.data_axis
        group = grid.group(dense_axis, 0) if lay.data_degree > 1 else (0,)
        egroup = grid.group("edp", 0) if self.model.is_moe and _edp(lay) > 1 else (0,)
        times = self.layer_times(layout, train, grid)
        per_layer = self.layer_params(layout)
        st = self.structure(layout)
        runs = lay.pipeline_schedule.chunk_runs(m)
        comm: dict[tuple[float, float], tuple[float, float]] = {}

        def gather_reduce(i: int) -> tuple[float, float]:
            d, e = per_layer[i]
            hit = comm.get((d, e))
            if hit is None:
                ag = self.collective_s(ALL_GATHER, group, 2.0 * d) + self.collective_s(ALL_GATHER, egroup, 2.0 * e)
                rs = (self.collective_s(REDUCE_SCATTER, group, grad_b * d)
                      + self.collective_s(REDUCE_SCATTER, egroup, grad_b * e))
                hit = comm[(d, e)] = (ag, rs)
            return hit

        selective = lay.recompute in ("selective", "op_sac")
        keep = fsdp_keeps_unsharded(lay, train.stack_spec)
        worst = busy_max = 0.0
        for s in range(lay.pp):
            rnd: list[_FsdpAction] = []
            busy = rs_all = 0.0
            for c in range(len(st.layers[s])):
                idx = list(st.chunk(s, c))
                cc = costs[s][c]
                busy += runs * (cc.fwd_s + cc.bwd_s)
                rec = recomputed_layers(layout, len(idx))
                fwd = [times[i].fwd_total_s for i in idx]
                bwd = [times[i].bwd_total_s + (times[i].fwd_total_s if j < rec else 0.0)
                       + (times[i].selective_s if selective else 0.0) for j, i in enumerate(idx)][::-1]
                pairs = [gather_reduce(i) for i in idx]
                ag, rs = [g for g, _ in pairs], [r for _, r in pairs]
                none = [0.0] * len(idx)
                # embedding/head/MTP compute (no gathers): after the forward's layers, before the backward's
                rnd.append((0.0, fwd, ag, none, max(cc.fwd_s - sum(fwd), 0.0)))
                # a kept stage's backward neither gathers nor reduce-scatters: both happen once per step
                rnd.append((max(cc.bwd_s - sum(bwd), 0.0), bwd, none if keep else ag[::-1], none if keep else rs[::-1],
                            0.0))
                rs_all += sum(rs)
            if keep:
                # rnd is the first round, the only one that gathers; every gradient is reduce-scattered after
                # the last backward, with nothing left to hide it (``_StageLowering._fsdp_reduce_chunk``)
                total = _fsdp_timeline(rnd, lay.fsdp_prefetch_layers) + (runs - 1) * busy / runs + rs_all
            elif runs <= 3:
                total = _fsdp_timeline(rnd * runs, lay.fsdp_prefetch_layers)
            else:
                t2 = _fsdp_timeline(rnd * 2, lay.fsdp_prefetch_layers)
                t3 = _fsdp_timeline(rnd * 3, lay.fsdp_prefetch_layers)
                total = t3 + (runs - 3) * (t3 - t2)
            worst = max(worst, total)
            busy_max = max(busy_max, busy)
        return max(worst - busy_max, 0.0)

    def _bucketed_s(self, coll: Collective, group: tuple[int, ...], total_bytes: float, bucket_bytes: float) -> float:
        if len(group) < 2 or total_bytes <= 0:
            return 0.0
        full, rest = divmod(total_bytes, bucket_bytes)
        return full * self.collective_s(coll, group, bucket_bytes) + self.collective_s(coll, group, rest)

    def _optimizer_s(self, layout: LayoutConfig, train: TrainConfig, params: float, experts: float) -> float:
        """The optimizer step as lowering charges it (``optimizer_bytes_per_param`` through HBM; experts
        sharded over the expert-data-parallel group)."""
        per_param = optimizer_bytes_per_param(train, train.stack_spec)
        shard = layout.data_degree if layout.shard_stage >= 1 else 1
        expert_shard = _edp(layout) if layout.shard_stage >= 1 else 1
        return self.cost_model(train).memory_op("optimizer.step",
                                                per_param * (params / shard + experts / expert_shard)).time_s
