"""Memory accounting: what each rank holds, in bytes, and the closed-form peak.

Static state follows the ZeRO paper's accounting as tabulated in the reference (Table C):
bf16 weights 2 bytes/param, gradients in the accumulation dtype (2 or 4 bytes; Megatron keeps an
fp32 ``main_grad``), Adam's fp32 master weights + m + v = 12 bytes/param (SGD with momentum: 8),
with ZeRO-1 sharding the optimizer, ZeRO-2 also the gradients, ZeRO-3/FSDP also the weights over the
sharding group. Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) term by term,
generalised to GQA and SwiGLU as in the reference's Llama breakdown; FlashAttention drops the
5*a*s^2*b softmax/dropout terms and keeps a fp32 log-sum-exp (4*a*s*b).

``ledger`` deltas attached to ops by lowering come from the functions here, and
``closed_form_peak`` walks the pipeline schedule at the same layer granularity without the engine,
so the two must agree (tested to 1 %).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.config import LayoutConfig, TrainConfig
from simtrain.model import ModelSpec
from simtrain.schedules import Action

MiB = 1024.0**2
CUBLAS_WORKSPACE_BYTES = 32 * MiB  # cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG default 4 MiB x 8)


@dataclass(frozen=True, slots=True)
class ActivationShape:
    """Per-rank activation dimensions of one micro-batch: tokens, TP degree, SP, kernels."""

    b: int
    s: int
    t: int
    sp: bool
    flash: bool
    dropout: bool

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on this rank's sequence shard (b * s)."""
        return self.b * self.s


def activation_shape(train: TrainConfig, layout: LayoutConfig, model: ModelSpec) -> ActivationShape:
    """The activation shape of this run (dropout defaults on for GELU/GPT-style models)."""
    dropout = train.dropout if train.dropout is not None else model.activation == "gelu"
    return ActivationShape(b=train.micro_batch_size, s=train.seq_len // layout.cp, t=layout.tp,
                           sp=layout.sequence_parallel, flash=train.attention_kernel == "flash",
                           dropout=dropout)


def layer_activation_bytes(model: ModelSpec, a: ActivationShape, recompute_attention: bool = False) -> float:
    """Bytes one transformer layer keeps for backward for one micro-batch (no full recompute).

    Korthikanti Table 2 terms (bytes, BF16, s*b*h units): replicated across TP unless SP:
    2 norm inputs (2+2), QKV input 2, MLP input 2, two dropout masks (1+1); sharded by TP: Q 2,
    K and V 2*2*g/a, attention output 2, MLP intermediates 2*f/h each (GELU: input and output;
    SwiGLU: gate, up and product), unfused attention softmax/dropout 5*a*s/h.
    """
    sbh = float(a.tokens * model.hidden)
    h, f = model.hidden, model.ffn_hidden
    replicated = (2 + 2 + 2 + 2) * sbh + (2 * sbh if a.dropout else 0.0)
    kv_ratio = model.kv_dim / model.hidden
    q_ratio = model.q_dim / model.hidden
    attn = (2 * q_ratio + 2 * 2 * kv_ratio + 2 * q_ratio) * sbh
    n_mlp = 3 if model.activation == "swiglu" else 2
    mlp = n_mlp * 2 * sbh * f / h
    if a.flash:
        attn += 4.0 * model.n_heads * a.tokens  # fp32 log-sum-exp per query and head
    elif not recompute_attention:
        attn += 5.0 * model.n_heads * a.s * a.tokens  # softmax out 2 + dropout mask 1 + dropout out 2
    sharded = (attn + mlp) / a.t
    return (replicated / a.t if a.sp else replicated) + sharded


def layer_checkpoint_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """Bytes kept per layer under full recompute: the layer input (2*s*b*h, /t with SP)."""
    x = 2.0 * a.tokens * model.hidden
    return x / a.t if a.sp else x


def backward_transient_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """Gradient buffers alive during one layer's backward: dY of the MLP up-projection and dX.

    The largest pair of tensors the autograd engine holds at once inside a layer's backward.
    """
    n_up = 2 if model.activation == "swiglu" else 1
    return 2.0 * a.tokens * (n_up * model.ffn_hidden / a.t + model.hidden)


def head_activation_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """Last stage, per micro-batch: final-norm input, LM-head input and fp32 logits (4*s*b*V/t)."""
    x = 2.0 * a.tokens * model.hidden
    return (x / a.t if a.sp else x) + 2.0 * a.tokens * model.hidden + 4.0 * a.tokens * model.vocab / a.t


def embedding_activation_bytes(model: ModelSpec, a: ActivationShape) -> float:
    """First stage, per micro-batch: int64 token ids (8*s*b) and the embedding dropout mask."""
    return 8.0 * a.tokens + (a.tokens * model.hidden / (a.t if a.sp else 1) if a.dropout else 0.0)


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one rank of a pipeline stage (after TP sharding)."""

    params: float
    layer_params: float


def static_memory(params: float, layer_params: float, model_layers_on_rank: int, layout: LayoutConfig,
                  train: TrainConfig, shard: int, gpu_context_bytes: float) -> dict[str, float]:
    """Bytes held for the whole step by one rank, by component.

    Args:
        params: parameters on this rank after TP sharding.
        layer_params: parameters of one transformer layer on this rank (for ZeRO-3 buffers).
        model_layers_on_rank: transformer layers on this rank (all chunks).
        shard: size of the parameter-sharding group (dp, or the hybrid-shard group).
        gpu_context_bytes: CUDA context + NCCL buffers.
    """
    stage = layout.shard_stage
    grad_b = 4.0 if train.grad_dtype == "fp32" else 2.0
    opt_b = 8.0 if train.optimizer == "sgd" else 12.0
    weights = 2.0 * params / (shard if stage >= 3 else 1)
    grads = grad_b * params / (shard if stage >= 2 else 1)
    optimizer = opt_b * params / (shard if stage >= 1 else 1)
    bucket = layout.grad_bucket_MiB * MiB
    if stage >= 3:
        buffers = (1 + layout.fsdp_prefetch_layers) * 2.0 * layer_params + grad_b * layer_params
    elif stage == 2:
        buffers = 2 * bucket
    else:
        buffers = 0.0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "comm_buffers": buffers,
            "workspace": CUBLAS_WORKSPACE_BYTES, "context": gpu_context_bytes}


@dataclass(slots=True)
class ChunkMemory:
    """Ledger deltas of one model chunk for one micro-batch, in op order.

    ``fwd`` and ``bwd`` are lists of (start_delta, end_delta) per op of the chunk's forward and
    backward in execution order, as lowering attaches them to ops.
    """

    fwd: list[tuple[float, float]] = field(default_factory=list)
    bwd: list[tuple[float, float]] = field(default_factory=list)


def closed_form_peak(actions: list[Action], chunks: dict[int, ChunkMemory]) -> float:
    """Peak dynamic bytes (activations and backward buffers) of one stage, walking its schedule.

    This walks the stage's schedule at op granularity without any timing (each op's start delta,
    then its end delta), so it is independent of the engine and must match the ledger's peak.
    """
    live = peak = 0.0
    for act in actions:
        deltas = chunks[act.chunk].fwd if act.kind == "F" else chunks[act.chunk].bwd
        for start, end in deltas:
            live += start
            peak = max(peak, live)
            live += end
            peak = max(peak, live)
    return peak
