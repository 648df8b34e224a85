"""What both evaluators (the engine and ``simtrain.engine.critical_path``) need beside a lowered program:
each stage's static memory and the group axes its ranks' roles are told apart by.

Kept here rather than in ``simtrain.studies.simulate`` so that engine/ never imports studies/.
"""

from __future__ import annotations

from simtrain.lower.lowering import Lowered
from simtrain.lower.memory import expert_static_memory, fp8_weight_cache_bytes, static_memory
from simtrain.lower.stack_rules import fsdp_keeps_unsharded
from simtrain.spec.config import RunConfig


def group_axes(run: RunConfig) -> set[str]:
    """The group axes the run's programs may communicate over (``simtrain.plan.roles``: a superset only
    splits roles finer)."""
    axes = {"tp", "cp", "dp", "dp_cp"}
    if run.model.is_moe:
        axes |= {"ep", "etp", "edp"}
    if run.layout.fsdp == "hybrid" and run.layout.fsdp_shard_size:
        axes |= {"dp_shard", "dp_replicate"}
    if run.layout.pp > 1:
        axes.add("pp_emb")
    return axes


def attach_static_memory(run: RunConfig, lowered: Lowered, context_bytes: float) -> None:
    """Set each program's ``static_mem`` (bytes by tag: weights, gradients, optimizer state, buffers,
    ``context_bytes`` of CUDA context and NCCL buffers) as ``simtrain.lower.memory.static_memory`` sizes it."""
    shard = run.layout.data_degree
    if run.layout.fsdp == "hybrid" and run.layout.fsdp_shard_size:
        shard = run.layout.fsdp_shard_size
    edp = run.layout.expert_data_degree
    for s, prog in enumerate(lowered.programs):
        layer = lowered.stage_layer_params[s]
        kept = layer if fsdp_keeps_unsharded(run.layout, run.train.stack_spec) else 0.0
        root = lowered.stage_params[s] + lowered.stage_expert_params[s] - layer
        prog.static_mem = static_memory(lowered.stage_params[s], lowered.max_layer_params, sum(lowered.layers[s]),
                                        run.layout, run.train, shard, context_bytes, kept, root)
        if fp8 := fp8_weight_cache_bytes(layer, run.layout, run.train, shard):
            prog.static_mem["fp8_weights"] = fp8
        if lowered.stage_pp_buffers[s]:
            prog.static_mem["pp_buffers"] = lowered.stage_pp_buffers[s]
        if lowered.stage_expert_params[s]:
            experts = expert_static_memory(lowered.stage_expert_params[s], run.layout, run.train, edp)
            for k, v in experts.items():
                prog.static_mem[k] += v
