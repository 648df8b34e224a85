"""A RunConfig's model, layout and batch as Megatron-LM arguments (``write_megatron``).

The text is one ``--flag value`` per line with ``\\`` continuations, for ``pretrain_gpt.py``; the fields
Megatron-LM has no flag for are listed as ``#`` comments at the top (and returned). Flag names and
meanings are those ``simtrain.formats.megatron`` reads (Megatron-LM ``megatron/training/arguments.py``,
core_r0.13), so reading the text back gives the same config for every field the flags carry.
"""

from __future__ import annotations

import shlex
from typing import Any

from simtrain.formats.megatron import RECOMPUTE_MODULES, node_gpus
from simtrain.plan.schedules import ScheduleKind
from simtrain.spec.config import RunConfig

__all__ = ["write_megatron"]


def _vocab_divisor(vocab: int, tp: int) -> int:
    """The largest ``--make-vocab-size-divisible-by`` (at most Megatron's 128) that leaves ``vocab`` unpadded."""
    return next((d for d in (128, 64, 32, 16, 8, 4, 2, 1) if vocab % (d * tp) == 0), 128)


def _model_flags(run: RunConfig, out: list[tuple[str, Any]], skipped: list[str]) -> None:
    m, tp = run.model, run.layout.tp
    out += [("--num-layers", m.n_layers), ("--hidden-size", m.hidden), ("--ffn-hidden-size", m.ffn_hidden),
            ("--num-attention-heads", m.n_heads)]  # fmt: skip
    if m.n_kv_heads is not None and m.mla is None:
        out += [("--group-query-attention", None), ("--num-query-groups", m.n_kv_heads)]
    if m.head_dim is not None:
        out.append(("--kv-channels", m.head_dim))
    if m.activation == "swiglu":
        out.append(("--swiglu", None))
    out.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    position = {"learned": "learned_absolute", "rope": "rope", "alibi": "none"}[m.position]
    out += [("--position-embedding-type", position), ("--max-position-embeddings", m.max_position)]
    divisor = _vocab_divisor(m.vocab, tp)
    out.append(("--vocab-size", m.vocab))
    if divisor != 128:
        out.append(("--make-vocab-size-divisible-by", divisor))
    if m.vocab % (divisor * tp):
        skipped.append(f"model.vocab {m.vocab} is not a multiple of TP {tp}: Megatron pads it")
    if not m.tied_embeddings:
        out.append(("--untie-embeddings-and-output-weights", None))
    if not m.linear_bias:
        out.append(("--disable-bias-linear", None))
    if m.qkv_bias and not m.linear_bias:
        out.append(("--add-qkv-bias", None))
    if m.qk_norm:
        out.append(("--qk-layernorm", None))
    for field, flagless in (("attn_out_bias", m.attn_out_bias and not m.linear_bias), ("attn_sinks", m.attn_sinks),
                            ("sliding_window", m.sliding_window is not None)):  # fmt: skip
        if flagless:
            skipped.append(f"model.{field}: no Megatron-LM flag written")
    if m.mla is not None:
        out.append(("--multi-latent-attention", None))
        if m.mla.q_lora_rank is not None:
            out.append(("--q-lora-rank", m.mla.q_lora_rank))
        out += [("--kv-lora-rank", m.mla.kv_lora_rank), ("--qk-head-dim", m.mla.qk_nope_head_dim),
                ("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim), ("--v-head-dim", m.mla.v_head_dim)]  # fmt: skip
    if m.mtp_depth:
        out.append(("--mtp-num-layers", m.mtp_depth))
    if m.moe is not None:
        e = m.moe
        out += [("--num-experts", e.n_experts), ("--moe-router-topk", e.top_k), ("--moe-ffn-hidden-size", e.ffn_hidden)]
        if e.n_shared_experts:
            out.append(("--moe-shared-expert-intermediate-size", e.n_shared_experts * e.shared_ffn))
        if e.router_bias:
            out.append(("--moe-router-enable-expert-bias", None))
        if e.n_group > 1:
            out += [("--moe-router-num-groups", e.n_group), ("--moe-router-group-topk", e.topk_group)]
        if e.first_k_dense or e.dense_layers:
            pattern = ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.n_layers))
            out.append(("--moe-layer-freq", f"[{pattern}]"))
        elif e.layer_freq != 1:
            out.append(("--moe-layer-freq", e.layer_freq))
        if e.expert_bias:
            skipped.append("model.moe.expert_bias: no Megatron-LM flag written")


def _layout_flags(run: RunConfig, out: list[tuple[str, Any]], skipped: list[str]) -> None:
    lay = run.layout
    out += [("--tensor-model-parallel-size", lay.tp), ("--pipeline-model-parallel-size", lay.pp)]
    if lay.vpp > 1:
        out.append(("--num-virtual-stages-per-pipeline-rank", lay.vpp))
    if lay.cp > 1:
        out += [("--context-parallel-size", lay.cp), ("--cp-comm-type", lay.cp_comm)]
    if lay.ep > 1:
        out.append(("--expert-model-parallel-size", lay.ep))
    if lay.etp is not None:
        out.append(("--expert-tensor-parallel-size", lay.etp))
    if run.model.moe is not None:
        dispatcher = lay.ep_dispatcher
        if dispatcher == "auto":
            dispatcher = "deepep" if run.model.moe.group_limited else "alltoall"
        out.append(("--moe-token-dispatcher-type", "flex" if dispatcher == "deepep" else "alltoall"))
    for flag, on in (("--sequence-parallel", lay.sequence_parallel), ("--tp-comm-overlap", lay.tp_comm_overlap),
                     ("--overlap-grad-reduce", lay.overlap_grad_reduce),
                     ("--overlap-param-gather", lay.overlap_param_gather)):  # fmt: skip
        if on:
            out.append((flag, None))
    if lay.fsdp == "full":
        out.append(("--use-torch-fsdp2", None))
    elif lay.shard_stage >= 1:
        out.append(("--use-distributed-optimizer", None))
    if lay.fsdp == "hybrid" or lay.zero_stage in (2, 3):
        skipped.append(f"layout zero_stage={lay.zero_stage} fsdp={lay.fsdp}: written as the distributed optimizer")
    if lay.resolved_schedule not in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B):
        skipped.append(f"layout.schedule {lay.schedule}: Megatron-LM runs (interleaved) 1F1B")
    if lay.recompute == "selective":
        mods = {v: k for k, v in RECOMPUTE_MODULES.items()}
        out += [("--recompute-granularity", "selective"),
                ("--recompute-modules", [mods[x] for x in lay.recompute_modules])]  # fmt: skip
    elif lay.recompute == "full":
        out.append(("--recompute-granularity", "full"))
        if lay.recompute_layers is None:
            out += [("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
        else:
            out += [("--recompute-method", "block"), ("--recompute-num-layers", lay.recompute_layers)]
    elif lay.recompute == "op_sac":
        skipped.append("layout.recompute op_sac is torchtitan's; no Megatron-LM flag written")
    if lay.offload_activation_layers:
        out += [("--cpu-offloading", None), ("--cpu-offloading-num-layers", lay.offload_activation_layers)]


def _train_flags(run: RunConfig, out: list[tuple[str, Any]], skipped: list[str]) -> None:
    tr = run.train
    out += [("--seq-length", tr.seq_len), ("--micro-batch-size", tr.micro_batch_size),
            ("--global-batch-size", tr.global_batch_seqs_resolved)]  # fmt: skip
    out.append(("--fp16", None) if tr.precision == "fp16" else ("--bf16", None))
    if tr.precision == "fp8":
        recipe = {"delayed": "delayed", "current": "tensorwise", "blockwise": "blockwise"}[tr.fp8_recipe]
        out += [("--fp8-format", "hybrid"), ("--fp8-recipe", recipe)]
    elif tr.precision == "fp4":
        out += [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]
    if tr.grad_bytes == 2.0:
        out.append(("--grad-reduce-in-bf16", None))
    if tr.stack_name == "megatron-te":
        out.append(("--cross-entropy-loss-fusion", None))
    elif tr.stack_name != "megatron-core":
        skipped.append(f"train.stack {tr.stack_name}: Megatron-LM arguments read back as megatron-core")
    bucket = tr.stack_spec.megatron_bucket_params if tr.stack_spec.megatron_buckets else None
    if bucket is not None:
        out.append(("--ddp-bucket-size", bucket))
    if not isinstance(tr.stack, str) and (rest := _unwritten(tr.stack.overrides())):
        skipped.append(f"train.stack overrides {rest}: not written (the preset's values are read back)")
    dropout = tr.dropout if tr.dropout is not None else run.model.activation == "gelu"
    value = "0.1" if dropout else "0.0"
    out += [("--attention-dropout", value), ("--hidden-dropout", value)]
    if tr.attention_kernel == "unfused":
        out.append(("--attention-backend", "unfused"))
    if tr.moe_capacity_factor is not None:
        out.append(("--moe-expert-capacity-factor", tr.moe_capacity_factor))
    out.append(("--optimizer", "sgd" if tr.optimizer == "sgd" else "adam"))
    if tr.moe_routing != "balanced":
        skipped.append("train.moe_routing skewed: a simulation assumption, no flag")


def write_megatron(run: RunConfig) -> tuple[str, list[str]]:
    """(arguments text, fields with no Megatron-LM flag) of a RunConfig; the text lists the latter as comments.

    The text is one ``--flag value`` per line with ``\\`` continuations, ready to paste after
    ``pretrain_gpt.py``; its first comment gives the ``torchrun`` node counts of ``hardware``.
    """
    out: list[tuple[str, Any]] = []
    skipped: list[str] = []
    _model_flags(run, out, skipped)
    _layout_flags(run, out, skipped)
    _train_flags(run, out, skipped)
    hw = run.hardware
    per_node = hw.gpus_per_node or node_gpus({"hardware": hw.model_dump()}, None)
    lines = [f"# Megatron-LM arguments for pretrain_gpt.py, written by simtrain from run {run.name!r}",
             f"# cluster: torchrun --nnodes {hw.n_nodes} --nproc-per-node {per_node}  ({hw.node})"]  # fmt: skip
    lines += [f"# not expressible as a flag: {s}" for s in skipped]
    body = [flag if value is None else f"{flag} {_quote(value)}" for flag, value in out]
    lines += [line + " \\" for line in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n", skipped


def _quote(value: Any) -> str:
    """A flag's value for a shell line: a list as separate words (``nargs='*'``), else one quoted word."""
    if isinstance(value, list):
        return " ".join(shlex.quote(str(v)) for v in value)
    return shlex.quote(str(value))


def _unwritten(overrides: dict[str, Any]) -> dict[str, Any]:
    """A stack's overrides (nested by group) less those the arguments carry (``--ddp-bucket-size``)."""
    out = {g: {k: v for k, v in fields.items() if (g, k) != ("dp", "megatron_bucket_params")}
           for g, fields in overrides.items()}
    return {g: f for g, f in out.items() if f}
