"""Layout search's estimate of a step: its time from the lowered, costed program, its per-stage peak
memory in closed form, without the engine.

Used by the layout search to rank and prune thousands of layouts before simulating the best few.

- time: ``simtrain.engine.probe``: one micro-batch per (stage, chunk) lowered by the simulator's own
  lowering, costed by its cost pass and timed by the critical-path evaluator (``simtrain.engine.
  critical_path``: the engine's collective plans, no flow contention); the pipeline by the schedule's
  action lists with those per-action costs. So every framework behaviour is written once, in lowering;
  this module only caches what layouts of one search share (layer plans, cost models, collective plans);
- memory: ``simtrain.lower.memory``'s static state (expert weights/grads/optimizer sharded by EP x ETP
  and ZeRO over edp, ``expert_static_memory``; FP8 weight copies) and the lowering's per-op activation
  deltas (``layer_plan.chunk_memory``) walked over the stage's schedule, exactly as the engine's ledger
  attaches them (on a schedule cut to the micro-batches past which a 1F1B/interleaved peak no longer
  grows).

It ignores contention between concurrent flows and compute slowed by overlapped communication; the
search simulates its best candidates to get those right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from simtrain.cost.costs import ComputeCostModel
from simtrain.engine.probe import LineComm, evaluate_layout, schedule_actions
from simtrain.engine.sync_wait import rank_wait_s
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.hardware import ClusterSpec
from simtrain.hardware.profile import compute_calibration
from simtrain.hardware.topology import Topology
from simtrain.lower.blocks import BlockBuilder
from simtrain.lower.emit import EdgeSegments, edge_segments
from simtrain.lower.flops import model_flops_per_step
from simtrain.lower.layer_plan import (
    LayerPlan,
    build_block,
    chunk_memory,
    first_layers,
    layer_plans,
    pp_runtime_bytes,
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
from simtrain.lower.stack_rules import fsdp_keeps_unsharded
from simtrain.plan.schedules import Action, Route, schedule_of
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig
from simtrain.spec.model import ModelSpec
from simtrain.spec.stacks import StackOverride


@dataclass(frozen=True, slots=True)
class Estimate:
    """A step's estimate (seconds) and per-stage peak memory (bytes, fragmentation included)."""

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
    sync_wait_s: float = 0.0
    """The wait for the slowest of the world's jittering ranks (``simtrain.engine.sync_wait``, as ``simulate``
    adds it): 0 on the built-in GPU profiles."""

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
                "pp comm": self.pp_s, "dp comm": self.dp_s, "optimizer": self.optimizer_s,
                "wait for the slowest rank": self.sync_wait_s}


@dataclass(slots=True)
class Estimator:
    """Estimates layouts of one model on one cluster; caches what layouts share (layer plans, cost
    models, collective times per group)."""

    model: ModelSpec
    cluster: ClusterSpec
    fragmentation_ratio: float = 0.05
    fabric: Fabric | None = None
    """The run's fabric (``simtrain.hardware.fabric.wiring.fabric_of``); None: the built-in one."""
    topo: Fabric = field(init=False)
    _costs: dict[tuple[str, str | StackOverride, str], ComputeCostModel] = field(default_factory=dict)
    _plans: dict[tuple[object, ...], tuple[BlockBuilder, dict[int, LayerPlan], EdgeSegments]] = field(
        default_factory=dict)
    comm: LineComm = field(init=False)
    _structs: dict[tuple[int, int, str], _Structure] = field(default_factory=dict)
    _params: dict[tuple[int, int, int], list[tuple[float, float]]] = field(default_factory=dict)
    _dynamic: dict[tuple[object, ...], tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.topo = self.fabric or Topology(self.cluster)
        self.comm = LineComm(self.topo, self.cluster.gpu)

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

    def _shape(self, layout: LayoutConfig, train: TrainConfig) -> tuple[BlockBuilder, dict[int, LayerPlan],
                                                                        EdgeSegments]:
        """The layout's block builder, every layer's plan (one per distinct structure) and the embedding's
        and head's segments, as lowering builds them (cached by what they depend on, ``_plan_key``)."""
        key = _plan_key(self.model, layout, train)
        hit = self._plans.get(key)
        if hit is None:
            block = build_block(self.model, layout, train)
            run = _layer_run(self.model, layout, train)
            hit = self._plans[key] = (block, layer_plans(run, block, self.model.n_layers + self.model.mtp_depth),
                                      edge_segments(block, layout))
        return hit

    def plans(self, layout: LayoutConfig, train: TrainConfig) -> dict[int, LayerPlan]:
        """Lowering's plan of every layer (main layers, then MTP blocks), one per distinct structure."""
        return self._shape(layout, train)[1]

    def edges(self, layout: LayoutConfig, train: TrainConfig) -> EdgeSegments:
        """The embedding's and head's segments lowering emits (``chunk_memory``'s emission steps)."""
        return self._shape(layout, train)[2]

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
        block, plans, _ = self._shape(layout, train)
        run = RunConfig.model_construct(model=self.model, layout=layout, train=train)
        r = evaluate_layout(run, self.cluster, self.topo, self.cost_model(train), block, plans, self.comm)
        seqs = train.global_batch_seqs_resolved
        m = seqs // (train.micro_batch_size * layout.dp)
        flops = model_flops_per_step(self.model, train.seq_len, seqs * train.seq_len)
        peak = self.cluster.gpu.bf16_flops_per_s  # MFU against the dense BF16 peak, as simulate reports it
        mem = self.stage_memory(layout, train, m)
        # the critical stage's compute and optimizer jitter over every rank of the world, as simulate's step
        wait = rank_wait_s(self.cluster.gpu, r.compute_s + r.optimizer_s, layout.world_size)
        step = r.step_time_s + wait
        return Estimate(step, r.compute_s, r.bubble_s, r.tp_s, 0.0, r.dp_s, r.optimizer_s, mem,
                        self.cluster.gpu.hbm_bytes, flops / (step * self.cluster.n_gpus * peak), r.ep_s, wait)


def _layer_run(model: ModelSpec, layout: LayoutConfig, train: TrainConfig) -> RunConfig:
    """A RunConfig of an already-valid (model, layout, train) without re-validation (lowering's
    plan functions read only these three)."""
    return RunConfig.model_construct(model=model, layout=layout, train=train)


def _plan_key(model: ModelSpec, layout: LayoutConfig, train: TrainConfig) -> tuple[object, ...]:
    """What a layer plan depends on: the activation shape, precision, stack, CP/EP/ETP, overlap and
    the selective-recompute modules (full recompute is applied per layer by the stage, not the plan)."""
    rec = layout.recompute if layout.recompute in ("selective", "op_sac") else "none"
    modules = layout.recompute_modules if rec == "selective" else ()
    dualpipe = schedule_of(layout.resolved_schedule).overlaps_forward_backward  # F&B overlap
    return (activation_shape(train, layout, model), train.precision, train.fp8_recipe, train.stack, layout.cp,
            layout.cp_comm, layout.ep, layout.expert_tp, layout.ep_comm_overlap or dualpipe, rec, modules,
            layout.tp_comm_overlap)


@dataclass(frozen=True, slots=True)
class _Structure:
    """Where the layers sit: the schedule's route, layers per (stage, chunk) and each chunk's first
    global layer (``lowering.split_layers`` / ``first_layers``)."""

    route: Route
    layers: list[list[int]]
    firsts: list[list[int]]

    def chunk(self, s: int, c: int) -> range:
        """Global layer indices of (stage, chunk), in forward order."""
        return range(self.firsts[s][c], self.firsts[s][c] + self.layers[s][c])

    def position(self, s: int, c: int) -> int:
        """Model stage (position on the path) of (stage, chunk)."""
        return self.route.position(0, s, c)


def _edp(layout: LayoutConfig) -> int:
    """Expert-data-parallel degree: tp x cp x dp / (ep x etp) (``lowering._StageLowering.edp``)."""
    return max(layout.expert_data_degree, 1)


@lru_cache(maxsize=256)
def _schedule(kind: str, pp: int, microbatches: int, vpp: int) -> list[list[Action]]:
    """The schedule's action lists, memoised (``simtrain.engine.probe.schedule_actions``)."""
    return schedule_actions(kind, pp, microbatches, vpp)


def single_chunk_peak(mem: ChunkMemory, in_flight: int) -> float:
    """Peak of a one-chunk 1F1B (or GPipe) stage with ``in_flight`` micro-batches alive at most.

    Each forward leaves A = its net bytes; the peak comes during the last forward before the first
    backward, (n - 1) A + (forward's running maximum), or during the first backward,
    n A + (backward's running maximum); later steady-state steps repeat those levels. Equals
    ``closed_form_peak`` on the full schedule (tested), in O(layers) instead of O(micro-batches x layers).
    """
    def walk(deltas: list[tuple[float, float]]) -> tuple[float, float]:
        live = top = 0.0
        for start, end in deltas:
            live += start
            top = max(top, live)
            live += end
            top = max(top, live)
        return live, top

    net, fwd_top = walk(mem.fwd)
    _, bwd_top = walk(mem.bwd)
    n = max(in_flight, 1)
    return max((n - 1) * net + fwd_top, n * net + bwd_top)


def _peak_microbatches(layout: LayoutConfig, microbatches: int) -> int:
    """Micro-batches of the schedule the memory walk needs (``Schedule.peak_microbatches``): 1F1B holds
    at most p - s in flight, reached before the (p + 1)-th micro-batch; interleaved 1F1B within 4 x p;
    ZB-H1, DualPipe and DualPipeV by ``Schedule.steady_microbatches``; GPipe all of them."""
    return schedule_of(layout.resolved_schedule).peak_microbatches(layout.pp, microbatches)
