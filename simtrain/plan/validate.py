"""Cross-field checks of a RunConfig: every problem, each with its dotted path."""

from __future__ import annotations

from typing import Any

from simtrain.hardware.load import load_node
from simtrain.hardware.profile import run_cluster
from simtrain.plan.phases import schedule_problems
from simtrain.plan.schedules import schedule_of
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.limits import (
    MAX_GPUS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MICROBATCHES,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MAX_WIDTH,
)

#: Upper bound of each integer model field (``simtrain.spec.limits``); other integer fields are widths.
_MODEL_LIMITS = {"n_layers": MAX_LAYERS, "mtp_depth": MAX_LAYERS, "first_k_dense": MAX_LAYERS,
                 "layer_freq": MAX_LAYERS, "dense_layers": MAX_LAYERS, "n_heads": MAX_HEADS,
                 "n_kv_heads": MAX_HEADS, "n_experts": MAX_HEADS, "top_k": MAX_HEADS, "n_shared_experts": MAX_HEADS,
                 "n_group": MAX_HEADS, "topk_group": MAX_HEADS, "vocab": MAX_VOCAB, "max_position": MAX_SEQ_LEN,
                 "sliding_window": MAX_SEQ_LEN}


def check_run(run: RunConfig) -> list[Problem]:
    """Problems that pydantic's per-field schema cannot see (divisibility, sizes, hardware).

    Sizes past ``simtrain.spec.limits`` are reported alone: the other checks build the cluster and
    schedules, which at such sizes would not finish."""
    out: list[Problem] = size_problems(run)
    if out:
        return out
    m, lay, tr, _hw = run.model, run.layout, run.train, run.hardware
    t = lay.tp
    for name, value in (("model.n_heads", m.n_heads), ("model.n_kv_heads", m.kv_heads),
                        ("model.ffn_hidden", m.ffn_hidden)):
        if value % t and not (name == "model.n_kv_heads" and t % value == 0):
            out.append(Problem("layout.tp", f"{t} does not divide {name}={value}"))
    if m.vocab % t:
        out.append(Problem("layout.tp", f"{t} does not divide model.vocab={m.vocab} (vocab-parallel embedding); "
                                        "pad the vocabulary to a multiple of tp"))
    if lay.pp > m.n_layers:
        out.append(Problem("layout.pp", f"{lay.pp} stages is more than model.n_layers={m.n_layers}"))
    if lay.vpp > 1 and lay.pp == 1:
        out.append(Problem("layout.vpp", f"{lay.vpp} needs layout.pp > 1"))
    # chunks, vpp, layers per chunk
    out += schedule_of(lay.resolved_schedule).layout_problems(lay.pp, lay.vpp, m.n_layers)
    if lay.sequence_parallel and t == 1:
        out.append(Problem("layout.sequence_parallel", "true needs layout.tp > 1"))
    if sorted(lay.order) != sorted(("tp", "cp", "ep", "dp", "pp")):
        out.append(Problem("layout.order", f"{list(lay.order)!r} must name each of tp, cp, ep, dp, pp once"))
    if lay.fsdp != "none" and lay.zero_stage not in (0, 3):
        out.append(Problem("layout.fsdp", f"{lay.fsdp!r} conflicts with layout.zero_stage={lay.zero_stage}"))
    if lay.fsdp == "hybrid" and (not lay.fsdp_shard_size or lay.dp % lay.fsdp_shard_size):
        out.append(Problem("layout.fsdp_shard_size", f"{lay.fsdp_shard_size!r} must be set and divide "
                                                     f"layout.dp={lay.dp} for hybrid shard"))
    out += _expert_problems(run)
    out += _offload_problems(run)
    if lay.cp > 1 and lay.cp_comm == "p2p" and tr.seq_len % (2 * lay.cp):
        # Megatron-core's causal load balancing splits the sequence into 2*cp chunks
        out.append(Problem("layout.cp", f"{lay.cp}: ring attention needs train.seq_len={tr.seq_len} divisible by "
                                        f"2*cp={2 * lay.cp} (two balanced chunks per CP rank)"))
    elif tr.seq_len % lay.cp:
        out.append(Problem("layout.cp", f"{lay.cp} does not divide train.seq_len={tr.seq_len}"))
    if lay.cp > 1 and lay.cp_comm == "a2a" and run.model.n_heads % (lay.tp * lay.cp):
        out.append(Problem("layout.cp_comm", f"'a2a' (Ulysses) splits heads over tp*cp={lay.tp * lay.cp}, which must "
                                             f"divide model.n_heads={run.model.n_heads}; use p2p or all_gather"))
    if m.position == "learned" and tr.seq_len > m.max_position:
        out.append(Problem("train.seq_len", f"{tr.seq_len} exceeds model.max_position={m.max_position} "
                                            "(learned position embeddings)"))
    if lay.sequence_parallel and tr.seq_len % t:
        out.append(Problem("train.seq_len", f"{tr.seq_len} is not divisible by layout.tp={t} (sequence parallel)"))
    out += _batch_problems(run)
    if (tr.global_batch_tokens is None) != (tr.global_batch_seqs is None):  # else the run's batch is unknown
        out += schedule_problems(run)
    out += _hardware_problems(run)
    return out


def _too_big(path: str, value: int, limit: int, what: str) -> Problem:
    return Problem(path, f"{value:,} is not valid; at most {limit:,} {what} (simtrain.spec.limits: no real run "
                         "comes near it)")


def _model_size_problems(fields: dict[str, Any], prefix: str) -> list[Problem]:
    """Integer model fields past their ``_MODEL_LIMITS`` (nested ``moe``, ``mla`` walked without recursion)."""
    out = []
    todo = [(fields, prefix)]
    while todo:
        node, where = todo.pop()
        for key, value in node.items():
            limit = _MODEL_LIMITS.get(key, MAX_WIDTH)
            if isinstance(value, dict):
                todo.append((value, f"{where}{key}."))
            elif isinstance(value, int) and not isinstance(value, bool) and value > limit:
                out.append(_too_big(f"{where}{key}", value, limit, "for this field"))
            elif isinstance(value, tuple | list):
                out += [_too_big(f"{where}{key}[{i}]", v, limit, "for this field") for i, v in enumerate(value)
                        if isinstance(v, int) and not isinstance(v, bool) and v > limit]
    return out


def size_problems(run: RunConfig) -> list[Problem]:
    """Sizes beyond ``simtrain.spec.limits``: model dimensions, the world size, the cluster and the micro-batches
    per step. Closed-form arithmetic only, so it answers at once for any input."""
    lay, tr, hw = run.layout, run.train, run.hardware
    out = _model_size_problems(run.model.model_dump(), "model.")
    if lay.world_size > MAX_GPUS:
        out.append(_too_big("layout", lay.world_size, MAX_GPUS, f"GPUs (dp*tp*pp*cp = {lay.dp}*{lay.tp}*{lay.pp}*"
                                                                f"{lay.cp})"))
    try:
        per_node = hw.gpus_per_node or load_node(hw.node).gpus_per_node
    except ConfigError:  # an unknown node: _hardware_problems names it
        per_node = hw.gpus_per_node or 1
    if hw.n_nodes * per_node > MAX_GPUS:
        out.append(_too_big("hardware.n_nodes", hw.n_nodes * per_node, MAX_GPUS,
                            f"GPUs (n_nodes {hw.n_nodes:,} x {per_node} GPUs per node)"))
    if lay.vpp * lay.pp > MAX_LAYERS:
        out.append(_too_big("layout.vpp", lay.vpp * lay.pp, MAX_LAYERS, "model chunks (pp x vpp)"))
    seqs = tr.global_batch_seqs_resolved if (tr.global_batch_seqs or tr.global_batch_tokens) else 0
    micro = seqs // (tr.micro_batch_size * lay.dp)
    if micro > MAX_MICROBATCHES:
        field = "train.global_batch_tokens" if tr.global_batch_tokens else "train.global_batch_seqs"
        out.append(_too_big(field, micro, MAX_MICROBATCHES, f"micro-batches per step (global batch {seqs:,} "
                                                            f"sequences / micro_batch_size {tr.micro_batch_size} / "
                                                            f"dp {lay.dp})"))
    return out


def _expert_problems(run: RunConfig) -> list[Problem]:
    """EP x ETP tile the tp x cp x dp ranks of a stage (Megatron-core expert mesh); MoE with TP needs SP."""
    lay, m = run.layout, run.model
    etp = lay.expert_tp
    plane = lay.tp * lay.cp * lay.dp
    out = []
    if m.moe is None:
        if lay.ep > 1:
            out.append(Problem("layout.ep", f"{lay.ep}: expert parallelism needs an MoE model; {m.name} is dense"))
        if lay.etp is not None and lay.etp != lay.tp:
            out.append(Problem("layout.etp", f"{lay.etp}: expert tensor parallelism needs an MoE model"))
        return out
    if plane % (lay.ep * etp):
        out.append(Problem("layout.ep", f"ep x etp = {lay.ep} x {etp} must divide tp x cp x dp = {plane} "
                                        "(experts fold over a stage's ranks)"))
    if m.moe.n_experts % lay.ep:
        out.append(Problem("layout.ep", f"{lay.ep} must divide model.moe.n_experts={m.moe.n_experts}"))
    if m.moe.ffn_hidden % etp:
        out.append(Problem("layout.etp", f"{etp} must divide the expert width model.moe.ffn_hidden={m.moe.ffn_hidden}"))
    if lay.tp > 1 and not lay.sequence_parallel:
        out.append(Problem("layout.sequence_parallel", "false: MoE with tensor parallelism needs sequence "
                                                       "parallelism (Megatron-core requires it); set it to true"))
    return out


def _offload_problems(run: RunConfig) -> list[Problem]:
    """CPU activation offloading's limits, as Megatron-core's TransformerConfig.__post_init__ checks them
    (megatron/core/transformer/transformer_config.py: offloaded layers < num_layers; no pipeline
    parallelism; no activation recomputation), and one model chunk per rank (no DualPipeV at pp = 1)."""
    lay, n = run.layout, run.layout.offload_activation_layers
    if n == 0:
        return []
    out = []
    if n >= run.model.n_layers:
        out.append(Problem("layout.offload_activation_layers", f"{n}: offload fewer layers than "
                                                               f"model.n_layers={run.model.n_layers} (0 to "
                                                               f"{run.model.n_layers - 1}; the last layer's "
                                                               "backward starts at once)"))
    if lay.pp > 1:
        out.append(Problem("layout.offload_activation_layers", f"{n} needs layout.pp = 1 (Megatron-core has no "
                                                               f"CPU offloading with pipeline parallelism; "
                                                               f"pp={lay.pp}); set it to 0 or pp to 1"))
    if lay.pp == 1 and (schedule_of(lay.resolved_schedule).chunks or 1) > 1:
        # DualPipeV at pp = 1 puts both chunks of its V on the one rank, each with half the layers, and runs
        # their forwards and backwards interleaved. Megatron-core offloads only at pp = 1, so with one chunk
        # per rank (transformer_config.py), and TE's handler syncs over one in-order pass of a stage's layers
        # (offload.sync_layers); simtrain.studies.estimate models one chunk too. Refused rather than guessed.
        out.append(Problem("layout.offload_activation_layers", f"{n} needs one model chunk per rank; "
                                                               f"schedule {lay.resolved_schedule!r} at pp=1 puts "
                                                               f"two chunks (a V) on the rank; set it to 0 or use "
                                                               f"schedule '1f1b'"))
    if lay.recompute != "none":
        out.append(Problem("layout.offload_activation_layers", f"{n} needs layout.recompute = 'none' "
                                                               f"(Megatron-core offloads no recomputed layer; "
                                                               f"recompute={lay.recompute!r}); set one of them off"))
    return out


def _batch_problems(run: RunConfig) -> list[Problem]:
    tr, lay = run.train, run.layout
    out = []
    if (tr.global_batch_tokens is None) == (tr.global_batch_seqs is None):
        return [Problem("train.global_batch_tokens", "give exactly one of train.global_batch_tokens and "
                                                     "train.global_batch_seqs")]
    if tr.global_batch_tokens is not None and tr.global_batch_tokens % tr.seq_len:
        out.append(Problem("train.global_batch_tokens", f"{tr.global_batch_tokens} is not a multiple of "
                                                        f"train.seq_len={tr.seq_len}"))
        return out
    seqs = tr.global_batch_seqs_resolved
    unit = tr.micro_batch_size * lay.dp
    if seqs % unit or seqs == 0:
        out.append(Problem("train.global_batch_tokens" if tr.global_batch_tokens else "train.global_batch_seqs",
                           f"{seqs} sequences are not divisible by micro_batch_size x dp = "
                           f"{tr.micro_batch_size} x {lay.dp} = {unit}"))
    else:
        out += _schedule_batch_problems(run, seqs // unit)
    return out


def _schedule_batch_problems(run: RunConfig, m: int) -> list[Problem]:
    """Micro-batch counts each pipeline schedule can run (simtrain.plan.schedules checks the same)."""
    lay, tr = run.layout, run.train
    field = "train.global_batch_tokens" if tr.global_batch_tokens else "train.global_batch_seqs"
    return schedule_of(lay.resolved_schedule).microbatch_problems(lay.pp, m, field)


def _hardware_problems(run: RunConfig) -> list[Problem]:
    hw = run.hardware
    try:
        cluster = run_cluster(hw, run.layout.world_size)  # applies hardware.profile (simtrain/hardware/profile.py)
    except ConfigError as exc:
        return list(exc.problems)
    if run.train.precision == "fp8" and cluster.gpu.fp8_flops_per_s <= 0:
        return [Problem("train.precision", f"'fp8' is not valid on {cluster.gpu.name}, which has no FP8 tensor "
                                           "cores; use bf16 or fp16")]
    if run.train.precision == "fp4" and not cluster.gpu.has_fp4:
        valid = "bf16, fp16 or fp8" if cluster.gpu.has_fp8 else "bf16 or fp16"
        return [Problem("train.precision", f"'fp4' is not valid on {cluster.gpu.name}, which has no FP4 tensor "
                                           f"cores (NVFP4 needs Blackwell or later); use {valid}")]
    world = run.layout.world_size
    if world != cluster.n_gpus:
        lay = run.layout
        return [Problem("layout", f"world size dp*tp*pp*cp = {lay.dp}*{lay.tp}*{lay.pp}*{lay.cp} = {world} "
                                  f"does not equal the cluster's GPUs ({hw.n_nodes} nodes x "
                                  f"{cluster.gpus_per_node} = {cluster.n_gpus})")]
    return []
