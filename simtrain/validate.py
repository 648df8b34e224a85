"""Cross-field checks of a RunConfig: every problem, each with its dotted path."""

from __future__ import annotations

from simtrain.batch import schedule_problems
from simtrain.config import RunConfig
from simtrain.errors import ConfigError, Problem
from simtrain.hardware import build_cluster


def check_run(run: RunConfig) -> list[Problem]:
    """Problems that pydantic's per-field schema cannot see (divisibility, sizes, hardware)."""
    out: list[Problem] = []
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
    if lay.vpp > 1 and m.n_layers % (lay.pp * lay.vpp):
        out.append(Problem("layout.vpp", f"{lay.vpp} does not divide the layers per stage "
                                         f"(model.n_layers={m.n_layers}, layout.pp={lay.pp})"))
    if lay.vpp > 1 and lay.pp == 1:
        out.append(Problem("layout.vpp", f"{lay.vpp} needs layout.pp > 1"))
    if lay.vpp > 1 and lay.resolved_schedule != "interleaved_1f1b":
        out.append(Problem("layout.schedule", f"{lay.schedule!r} cannot run vpp={lay.vpp}; use interleaved_1f1b"))
    if lay.resolved_schedule == "interleaved_1f1b" and lay.vpp == 1:
        out.append(Problem("layout.schedule", "interleaved_1f1b needs layout.vpp > 1"))
    if lay.sequence_parallel and t == 1:
        out.append(Problem("layout.sequence_parallel", "true needs layout.tp > 1"))
    if sorted(lay.order) != sorted(("tp", "cp", "ep", "dp", "pp")):
        out.append(Problem("layout.order", f"{list(lay.order)!r} must name each of tp, cp, ep, dp, pp once"))
    if lay.fsdp != "none" and lay.zero_stage not in (0, 3):
        out.append(Problem("layout.fsdp", f"{lay.fsdp!r} conflicts with layout.zero_stage={lay.zero_stage}"))
    if lay.fsdp == "hybrid" and (not lay.fsdp_shard_size or lay.dp % lay.fsdp_shard_size):
        out.append(Problem("layout.fsdp_shard_size", f"{lay.fsdp_shard_size!r} must be set and divide "
                                                     f"layout.dp={lay.dp} for hybrid shard"))
    if (lay.dp * lay.cp) % lay.ep:
        out.append(Problem("layout.ep", f"{lay.ep} must divide dp*cp={lay.dp * lay.cp} (EP folds over them)"))
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
    out += schedule_problems(run)
    out += _hardware_problems(run)
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
    elif lay.resolved_schedule == "interleaved_1f1b" and (seqs // unit) % lay.pp:
        out.append(Problem("train.global_batch_tokens" if tr.global_batch_tokens else "train.global_batch_seqs",
                           f"interleaved 1F1B needs the micro-batch count ({seqs // unit}) to be a multiple "
                           f"of layout.pp={lay.pp}"))
    return out


def _hardware_problems(run: RunConfig) -> list[Problem]:
    hw = run.hardware
    try:
        cluster = build_cluster(hw.node, hw.n_nodes, gpu=hw.gpu, nics_per_node=hw.nics_per_node,
                                nic_Gbps=hw.nic_Gbps, oversubscription=hw.oversubscription,
                                nodes_per_leaf=hw.nodes_per_leaf, net_hop_latency_us=hw.net_hop_latency_us)
    except ConfigError as exc:
        return list(exc.problems)
    world = run.layout.world_size
    if world != cluster.n_gpus:
        lay = run.layout
        return [Problem("layout", f"world size dp*tp*pp*cp = {lay.dp}*{lay.tp}*{lay.pp}*{lay.cp} = {world} "
                                  f"does not equal the cluster's GPUs ({hw.n_nodes} nodes x "
                                  f"{cluster.gpus_per_node} = {cluster.n_gpus})")]
    return []
