"""Lowering: (model, layout, train, grid) -> one op program per pipeline stage.

``lower_program`` is a dispatcher over small helpers: the schedule gives each stage its ordered actions;
each forward/backward action emits the embedding/layers/head segments of ``blocks``; pipeline sends
follow each action; data-parallel gradient reduction is bucketed and overlapped with backward
(Megatron-LM DDP / PyTorch DDP buckets), ZeRO-1/2 reduce-scatter gradients and all-gather
parameters, ZeRO-3/FSDP all-gather each layer's parameters before its forward and backward (with
prefetch) and reduce-scatter its gradients; the optimizer step closes the program. Ranks of one
stage differ only by their dp/tp coordinates, so one program serves them all (symmetric) and full
mode runs it on every rank.

The program is hardware-neutral (``lower_program``): compute ops hold kernel descriptors
(``simtrain.lower.kernels``), host copies their bytes, and no op a time; ``simtrain.cost.cost_pass.lower``
runs the cost pass over it with one cost source.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from simtrain.lower.emit import edge_segments
from simtrain.lower.kernels import MemoryBound
from simtrain.lower.layer_plan import (
    build_block,
    chunk_memory,
    embedding_sync_bytes,
    first_layers,
    layer_plans,
    microbatches,
    pp_runtime_bytes,
    split_layers,
)
from simtrain.lower.memory import (
    ChunkMemory,
    embedding_activation_bytes,
    head_activation_bytes,
)
from simtrain.lower.ops import OpKind, Program
from simtrain.lower.stack_rules import (
    dp_bucket_bytes,
    dp_overlaps,
    optimizer_bytes_per_param,
)
from simtrain.lower.stage import _StageLowering
from simtrain.plan.schedules import Action, schedule_of, split_backward_keys
from simtrain.spec.collective_kinds import ALL_GATHER, ALL_REDUCE
from simtrain.spec.config import RunConfig


@dataclass(slots=True)
class Lowered:
    """Everything lowering produces: programs, schedule, and memory facts for the closed form."""

    programs: list[Program]
    schedule: list[list[Action]]
    chunk_memory: list[dict[int, ChunkMemory]]
    layers: list[list[int]]
    microbatches: int
    stage_params: list[float] = field(default_factory=list)
    stage_expert_params: list[float] = field(default_factory=list)
    stage_layer_params: list[float] = field(default_factory=list)
    """Transformer-layer parameters per stage on one rank (the linear layers FP8 keeps copies of)."""
    max_layer_params: float = 0.0
    """Largest per-rank layer (dense part), for ZeRO-3/FSDP gather buffers."""
    stage_pp_buffers: list[float] = field(default_factory=list)
    """Bytes each stage's pipeline runtime keeps for the whole step (``memory.pipeline_stage_buffer_bytes``)."""


def _finish_stage(sl: _StageLowering) -> None:
    """Deferred gradient reductions, the optimizer step and (ZeRO-1/2) the parameter all-gather."""
    lay, train = sl.run.layout, sl.run.train
    last = sl.em.last_compute
    for coll, size, axis in sl.deferred:
        sl.dp_collective(coll, axis, size, f"dp.{coll}", () if last is None else (last,))
    emb = embedding_sync_bytes(sl.run.model, lay, train, {sl.vstage(c) for c in range(len(sl.layers))}, sl.n_virtual,
                               sl.stack)
    if emb > 0:
        sl.dp_collective(ALL_REDUCE, "pp_emb", emb, "pp.embedding_grad_all_reduce", () if last is None else (last,))
    chunks = range(len(sl.layers))
    params = sum(sl.chunk_params(c) for c in chunks)
    experts = sum(sl.chunk_expert_params(c) for c in chunks)
    shard = lay.data_degree if lay.shard_stage >= 1 else 1
    if lay.fsdp == "hybrid" and lay.fsdp_shard_size:
        shard = lay.fsdp_shard_size
    expert_shard = sl.edp if lay.shard_stage >= 1 else 1
    per_param = optimizer_bytes_per_param(train, sl.stack)
    kernel = MemoryBound("optimizer.step", per_param * (params / shard + experts / expert_shard))
    deps = (sl.dp_ops[-1],) if sl.dp_ops else ()
    sl.em.pending_comm = None
    # a synchronous stage's last send is waited for before the optimizer too (Megatron's req.wait())
    sends = [d for d in sl.em.extra_deps if sl.prog.ops[d].kind == OpKind.SEND] if sl.sync_p2p else []
    sl.em.extra_deps = [*deps, *sends]
    opt = sl.em.compute((kernel,), "optimizer", -1, 0)
    assert opt is not None
    if lay.shard_stage in (1, 2) and not dp_overlaps(lay, sl.stack)[1]:
        for size, axis, degree in ((params, lay.data_axis, lay.data_degree), (experts, "edp", sl.edp)):
            if degree > 1 and size > 0:
                sl.dp_collective(ALL_GATHER, axis, 2.0 * size, "dp.param_all_gather", (opt.idx,))


def _param_gathers_at_start(sl: _StageLowering) -> None:
    """ZeRO-1/2 with overlapped parameter gather: the previous step's updated parameters are
    all-gathered bucket by bucket while this step's forward runs (Megatron --overlap-param-gather).

    Buckets follow the parameters in forward order (the dense buffer over the data axis, the routed
    experts' over ``edp``), issued in that order, and each unit's first forward (the embedding, a layer,
    the head) waits only for the buckets that carry its parameters: Megatron's forward pre-hook of a
    module waits for its own bucket's all-gather and dispatches the next one
    (megatron/core/distributed/param_and_grad_buffer.py ``finish_param_sync``), so the later buckets'
    all-gathers run beside the earlier layers' forward."""
    lay = sl.run.layout
    if lay.shard_stage not in (1, 2) or not dp_overlaps(lay, sl.stack)[1]:
        return
    for c in range(len(sl.layers)):
        bucket = dp_bucket_bytes(lay, sl.stack, 2.0, sl.stage, c)
        units = sl.gather_units(c)
        parts: list[tuple[int, int, float, str]] = []  # (first unit, buffer, bytes, axis)
        for buf, axis, degree in ((0, lay.data_axis, lay.data_degree), (1, "edp", sl.edp)):
            if degree <= 1:
                continue
            ends = list(itertools.accumulate(2.0 * u[buf] for u in units))
            start = 0.0
            while start < ends[-1]:
                part = min(ends[-1] - start, bucket)
                parts.append((bisect.bisect_right(ends, start), buf, part, axis))  # the unit holding byte `start`
                start += part
        parts.sort(key=lambda p: (p[0], p[1]))
        gathers = [(first, sl.dp_collective(ALL_GATHER, axis, part, "dp.param_all_gather", ()).idx)
                   for first, _, part, axis in parts]
        if gathers:
            sl.param_gathers[c] = gathers


def _chunk_memory(sl: _StageLowering, chunk: int) -> ChunkMemory:
    """The ledger deltas of one chunk of a stage (see ``chunk_memory``)."""
    m, shape = sl.run.model, sl._shape
    plans = [sl.plan(chunk, i) for i in range(sl.layers[chunk])]
    edges = (embedding_activation_bytes(m, shape), head_activation_bytes(m, shape), sl._loss_transient)
    mtp = sl._mtp() if sl.vstage(chunk) == sl.n_virtual - 1 else []
    return chunk_memory(plans, sl.vstage(chunk), sl.n_virtual - 1, sl.run.layout, edges, mtp,
                        edge_segments(sl.block, sl.run.layout))


def lower_program(run: RunConfig) -> Lowered:
    """Lower a validated run into one program per pipeline stage, with sends matched to receives: the
    hardware-neutral program (kernel descriptors, no times; ``cost_pass.cost_program`` costs it)."""
    lay = run.layout
    m = microbatches(run)
    block = build_block(run.model, lay, run.train)
    sched = schedule_of(lay.resolved_schedule)
    route = sched.route(lay.pp, m, lay.vpp)
    layers = split_layers(run.model.n_layers, lay.pp, lay.vpp, route)
    plans = layer_plans(run, block, run.model.n_layers + run.model.mtp_depth)
    firsts = first_layers(layers, route)
    schedule = sched.actions(lay.pp, m, lay.vpp)
    lowered = Lowered(programs=[], schedule=schedule, chunk_memory=[], layers=layers, microbatches=m)
    stages = []
    for s in range(lay.pp):
        sl = _StageLowering(run, s, layers[s], plans, firsts[s], block, route, split_backward_keys(schedule[s]))
        _param_gathers_at_start(sl)
        _emit_actions(sl, schedule[s])
        _finish_stage(sl)
        stages.append(sl)
        chunks = range(len(layers[s]))
        lowered.chunk_memory.append({c: _chunk_memory(sl, c) for c in chunks})
        lowered.stage_params.append(sum(sl.chunk_params(c) for c in chunks))
        lowered.stage_expert_params.append(sum(sl.chunk_expert_params(c) for c in chunks))
        lowered.stage_layer_params.append(sum(sl.plan(c, i).params_per_rank + sl.plan(c, i).expert_params_per_rank
                                              for c in chunks for i in range(layers[s][c])))
        lowered.stage_pp_buffers.append(pp_runtime_bytes(run.model, lay, run.train,
                                                         [sl.vstage(c) for c in chunks], sl.n_virtual - 1, m))
    lowered.max_layer_params = max(p.params_per_rank + p.expert_params_per_rank for p in plans.values())
    _match_sends(stages)
    lowered.programs = [sl.prog for sl in stages]
    return lowered


def _emit_actions(sl: _StageLowering, actions: list[Action]) -> None:
    """Emit a stage's actions in order; an F flagged ``overlap_with_next`` runs with the next action
    as one overlapped pair. A chunk's last backward (or W, when split) reduces its gradients."""
    last = {}
    for a in actions:
        if a.kind == ("W" if (a.microbatch, a.chunk) in sl.split else "B"):
            last[a.chunk] = a.microbatch
    i = 0
    while i < len(actions):
        a = actions[i]
        steps = sl.steps(a, a.kind != "F" and a.microbatch == last.get(a.chunk))
        if a.overlap_with_next and i + 1 < len(actions):
            b = actions[i + 1]
            sl.run_pair(steps, sl.steps(b, b.kind != "F" and b.microbatch == last.get(b.chunk)))
            i += 2
            continue
        for _ in steps:
            pass
        i += 1


def _match_sends(stages: list[_StageLowering]) -> None:
    """Point each receiving op at the send that feeds it: (kind, mb, dst virtual stage)."""
    index = {key: (sl.stage, idx) for sl in stages for key, idx in sl.sends.items()}
    for sl in stages:
        for op_idx, key in sl.em.recv_ops.items():
            sl.prog.ops[op_idx].remote = index[key]
