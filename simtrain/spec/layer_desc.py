"""One transformer layer, described once: an ordered list of typed components.

Each component knows its weights (``Linear`` shapes and other parameter vectors, elements), the
forward model FLOPs one token costs (2 x the GEMM weights it multiplies through, plus a
sequence-dependent part for attention) and the bytes it keeps for backward per micro-batch under a
recompute policy (``SavePolicy``). ``simtrain.spec.model`` builds a layer from a ``ModelSpec``
(``ModelSpec.layer``) and derives the parameter counts from it, ``simtrain.lower.flops`` the model FLOPs
and ``simtrain.lower.memory`` the saved activations, so a new block type (an attention variant, an SSM
mixer) is a new ``Component`` subclass and nothing else.

Units: parameters and widths in elements; FLOPs per token; bytes per micro-batch on one rank before
TP/SP sharding is applied (``SavedBytes`` says how each part shards). The byte formulas keep the
operation order of the code they replaced (Korthikanti et al. 2022, arXiv 2205.05198, Table 2 terms;
``simtrain.lower.memory`` module docstring), so every float is bit-identical to it.

A new block type: subclass ``Component`` (``linears``/``params``, ``seq_flops_per_token``,
``saved``) and return it from ``ModelSpec.layer`` (a ``ModelSpec`` subclass, or a new spec field
read by ``ModelSpec.build_layer``); ``tests/test_layer_desc.py`` does this for a toy SSM-like mixer.
The kernels (``simtrain.lower.blocks``) walk the same description: each component's kernels are looked up
by its type (``simtrain.lower.blocks.KERNELS``), and a type with no kernels of its own runs its
``linears`` per TP rank around one memory-bound kernel (``simtrain.lower.blocks.generic``), so it is
lowered, costed and simulated too (``tests/test_block_kernels.py``).

This module imports nothing from simtrain: ``model_spec``, ``flops`` and ``memory`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ActivationShape",
    "Attention",
    "AttentionCore",
    "Component",
    "Embedding",
    "LatentAttention",
    "LayerDesc",
    "Linear",
    "MLP",
    "MoE",
    "Norm",
    "NormKind",
    "Projection",
    "RecomputeModule",
    "SavePolicy",
    "SavedBytes",
    "TPStyle",
]


class TPStyle(StrEnum):
    """How tensor parallelism splits a linear layer (Megatron-LM, Shoeybi et al. 2019 §3)."""

    COL = "col"
    """Column-parallel: output features sharded over TP."""
    ROW = "row"
    """Row-parallel: input features sharded; each rank's output is a partial sum, reduced after."""
    REP = "rep"
    """Replicated on every TP rank (MLA's down projections to the latents)."""


class NormKind(StrEnum):
    """Normalisation layer: LayerNorm (gain + bias, Ba et al. 2016) or RMSNorm (gain, Zhang & Sennrich 2019)."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class RecomputeModule(StrEnum):
    """Modules selective recompute may stop saving (Megatron-core ``--recompute-modules``)."""

    CORE_ATTN = "core_attn"
    LAYERNORM = "layernorm"
    MLA_UP_PROJ = "mla_up_proj"
    ACT = "act"


@dataclass(frozen=True, slots=True)
class ActivationShape:
    """Per-rank activation dimensions of one micro-batch: tokens, TP degree, SP, kernels."""

    b: int
    s: int
    t: int
    sp: bool
    flash: bool
    dropout: bool
    expert_load: float = 1.0
    """Routed token copies of the busiest EP rank as a multiple of balanced routing
    (``simtrain.plan.routing.worst_rank_load``): its routed experts keep that many more activations."""
    gathered_inputs: bool = False
    """Sequence parallelism through DTensor (``SoftwareStack.dtensor_tp``): the column-parallel linears
    save the all-gathered, full-sequence input they multiply (autograd saves the matmul's operand; a
    compiled graph may not recompute the collective: torch/_functorch/partitioners.py bans recomputing
    ops outside its allowlist), so the QKV and MLP inputs are kept whole, not /t. Megatron-core saves
    the sequence shard and all-gathers it again for the weight gradient (Korthikanti et al. 2022, 4.2.2)."""

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on this rank's sequence shard (b * s)."""
        return self.b * self.s


@dataclass(frozen=True, slots=True)
class SavePolicy:
    """What a layer keeps for backward: recompute of the attention core, selective modules, stack."""

    core_attn: bool = False
    """The attention core (softmax, dropout) is recomputed: unfused kernels keep no s x s terms."""
    modules: frozenset[RecomputeModule] = frozenset()
    """Selectively recomputed modules (``RecomputeModule``)."""
    eager_hf: bool = False
    """Eager PyTorch as in HF transformers' Llama (``memory.ACTIVATION_STACKS``): norms keep fp32
    copies, SwiGLU keeps silu(gate); False: fused kernels (Megatron-core / Transformer Engine)."""


@dataclass(frozen=True, slots=True)
class SavedBytes:
    """Bytes a component keeps for backward for one micro-batch, grouped by how TP/SP shards them."""

    replicated: float = 0.0
    """Replicated over TP, /t with sequence parallelism (norm inputs, dropout masks)."""
    linear_inputs: float = 0.0
    """Inputs of column-parallel linears: replicated, /t with SP unless DTensor keeps them gathered."""
    sharded: float = 0.0
    """Sharded over TP (/t): attention tensors, MLP intermediates."""

    def __add__(self, other: SavedBytes) -> SavedBytes:
        return SavedBytes(self.replicated + other.replicated, self.linear_inputs + other.linear_inputs,
                          self.sharded + other.sharded)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Linear:
    """One GEMM weight ``d_in`` x ``d_out`` (elements), an optional bias of ``d_out``, its TP style.

    ``name`` is the Hugging Face module name (``q_proj``, ``kv_b_proj``) or torchtitan's (``w1``).
    """

    name: str
    d_in: int
    d_out: int
    tp: TPStyle = TPStyle.COL
    bias: bool = False

    @property
    def weights(self) -> int:
        """GEMM weight elements d_in * d_out (forward FLOPs per token: 2x this)."""
        return self.d_in * self.d_out

    @property
    def params(self) -> int:
        """Weights plus the bias, elements."""
        return self.weights + (self.d_out if self.bias else 0)

    def per_rank(self, t: int) -> tuple[int, int]:
        """(d_in, d_out) of the GEMM one of ``t`` TP ranks runs: column-parallel splits the output,
        row-parallel the input, replicated neither (Megatron-core MLA replicates the down projections)."""
        if self.tp == TPStyle.COL:
            return self.d_in, self.d_out // t
        if self.tp == TPStyle.ROW:
            return self.d_in // t, self.d_out
        return self.d_in, self.d_out


class Component:
    """A part of a layer. Subclasses override what they have; the defaults are "nothing".

    The type is the component's kind (``isinstance`` dispatch, no name strings).
    """


    def linears(self) -> tuple[Linear, ...]:
        """The GEMM weights every token multiplies through, in forward order."""
        return ()

    def params(self) -> int:
        """Parameters held, elements (the linears' weights and biases by default)."""
        return sum(lin.params for lin in self.linears())

    def active_params(self) -> int:
        """Parameters one token uses (MoE: top-k routed experts only)."""
        return self.params()

    def gemm_weights_per_token(self) -> int:
        """GEMM weights one token multiplies through (no biases): forward FLOPs per token are 2x this."""
        return sum(lin.weights for lin in self.linears())

    def seq_flops_per_token(self, seq_len: int) -> float:
        """Forward model FLOPs per token that grow with the sequence (attention scores and x V)."""
        return 0.0

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        """Bytes kept for backward for one micro-batch of shape ``a`` under ``policy``."""
        return SavedBytes()


@dataclass(frozen=True, slots=True)
class Norm(Component):
    """A LayerNorm/RMSNorm over ``width``; its output is the next linear's input."""

    width: int
    norm: NormKind

    def params(self) -> int:
        return (2 if self.norm == NormKind.LAYERNORM else 1) * self.width

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        # Korthikanti Table 2: the norm keeps its bf16 input (2 sbh); its bf16 output is the input the
        # next linear keeps for its weight gradient (2 sbh), which ``layernorm`` recompute rebuilds.
        replicated = 2.0 * a.tokens * self.width
        if policy.eager_hf:  # HF LlamaRMSNorm: fp32 input copy 4 + normalised bf16 2 - bf16 input 2, fp32 rsqrt
            replicated += 4.0 * a.tokens * self.width + 4.0 * a.tokens
        kept = RecomputeModule.LAYERNORM not in policy.modules
        return SavedBytes(replicated=replicated, linear_inputs=2.0 * a.tokens * self.width if kept else 0.0)


@dataclass(frozen=True, slots=True)
class AttentionCore:
    """Scaled dot-product attention: ``heads`` query heads, query/key width ``d_qk``, value width ``d_v``.

    ``window`` None: causal over the whole sequence; else sliding window w (a query sees itself and
    the w-1 keys before it; GPT-OSS, Mistral).
    """

    heads: int
    d_qk: int
    d_v: int
    window: int | None = None

    def keys_per_query(self, seq_len: int) -> float:
        """Mean keys a query attends to in a causal sequence of ``seq_len`` tokens.

        Full causal: s/2 (Megatron convention). Sliding window w < s: w - w²/(2s), the same
        continuous approximation (a query at p sees min(p + 1, w) keys); s/2 for w >= s.
        """
        if self.window is None or self.window >= seq_len:
            return seq_len * 0.5
        return self.window - self.window * self.window / (2.0 * seq_len)

    def flops_per_token(self, seq_len: int) -> float:
        """QK^T (2·keys·d_qk per head) plus attention x V (2·keys·d_v per head), forward."""
        return 2 * self.keys_per_query(seq_len) * (self.d_qk + self.d_v) * self.heads

    def saved_core(self, a: ActivationShape, core_recomputed: bool) -> float:
        """Bytes of the core itself: flash keeps a fp32 log-sum-exp per query and head; unfused
        kernels keep softmax out 2 + dropout mask 1 + dropout out 2 per score unless recomputed."""
        if a.flash:
            return 4.0 * self.heads * a.tokens
        if not core_recomputed:
            return 5.0 * self.heads * a.s * a.tokens
        return 0.0


@dataclass(frozen=True, slots=True)
class Attention(Component):
    """Self-attention: q/k/v/o projections (HF modeling_llama.py LlamaAttention) around a core.

    ``q_dim`` = heads·d_qk and ``kv_dim`` = kv_heads·d_qk are the query and key widths; ``extra``
    counts parameter vectors outside the linears (Qwen3 q/k norms, GPT-OSS sinks, MLA latent norms).
    """

    hidden: int
    q_dim: int
    kv_dim: int
    core: AttentionCore
    projections: tuple[Linear, ...]
    extra: int = 0

    def linears(self) -> tuple[Linear, ...]:
        return self.projections

    def params(self) -> int:
        return sum(lin.params for lin in self.projections) + self.extra

    def seq_flops_per_token(self, seq_len: int) -> float:
        return self.core.flops_per_token(seq_len)

    def saved_qkv(self, a: ActivationShape) -> float:
        """Q 2, K and V 2·2·g/a, attention output 2 (in sbh units scaled by width/h; Korthikanti Table 2).

        The output term uses the query width a·d_qk as the old counter did (under MLA the output is
        a·d_v; kept so the numbers do not move).
        """
        sbh = float(a.tokens * self.hidden)
        q_ratio, kv_ratio = self.q_dim / self.hidden, self.kv_dim / self.hidden
        return (2 * q_ratio + 2 * 2 * kv_ratio + 2 * q_ratio) * sbh

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        attn = self.saved_qkv(a) + self.core.saved_core(a, policy.core_attn)
        mask = 1.0 * a.tokens * self.hidden if a.dropout else 0.0  # output dropout mask, 1 B
        return SavedBytes(replicated=mask, sharded=attn)

    def wgrad_input_bytes(self, a: ActivationShape) -> float:
        """Sharded bytes the weight gradients read besides the QKV input: the out-projection input."""
        return 2.0 * a.tokens * self.core.heads * self.core.d_v


@dataclass(frozen=True, slots=True)
class LatentAttention(Attention):
    """DeepSeek multi-head latent attention (DeepSeek-V3 report §2.1.1): projections through the
    latents ``q_latent`` (d_c'; None: plain q_proj) and ``kv_latent`` (d_c) plus the shared RoPE key
    width ``rope_dim``; ``mla_up_proj`` recompute keeps the latents instead of Q, K, V."""

    q_latent: int | None = None
    kv_latent: int = 0
    rope_dim: int = 0

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        kept = Attention.saved(self, a, policy)
        if RecomputeModule.MLA_UP_PROJ not in policy.modules:
            return kept
        tokens = float(a.tokens)
        latents = 2.0 * tokens * ((self.q_latent or self.hidden) + self.kv_latent + self.rope_dim)
        out = 2.0 * tokens * self.core.heads * self.core.d_v
        # the latents are replicated over TP (x t against the final /t); Q, K, V and the output go
        attn = latents * a.t + out + (kept.sharded - 2.0 * tokens * (self.q_dim + 2 * self.kv_dim + self.q_dim))
        return SavedBytes(replicated=kept.replicated, linear_inputs=kept.linear_inputs, sharded=attn)


@dataclass(frozen=True, slots=True)
class MLP(Component):
    """Dense MLP h→f→h: GELU (w1, w2) or gated SwiGLU (w1 gate, w3 up, w2 down; Shazeer 2020)."""

    hidden: int
    ffn: int
    gated: bool
    bias: bool = False

    @property
    def n_up(self) -> int:
        """Input-side projections: 2 gated (gate, up), 1 ungated."""
        return 2 if self.gated else 1

    def linears(self) -> tuple[Linear, ...]:
        h, f, b = self.hidden, self.ffn, self.bias
        up = (Linear("w1", h, f, TPStyle.COL, b), Linear("w3", h, f, TPStyle.COL, b))[: self.n_up]
        return (*up, Linear("w2", f, h, TPStyle.ROW, b))

    def params(self) -> int:
        weights = (self.n_up + 1) * self.hidden * self.ffn
        return weights + (self.n_up * self.ffn + self.hidden if self.bias else 0)

    def gemm_weights_per_token(self) -> int:
        return self.hidden * self.ffn * self.n_up + self.ffn * self.hidden

    def intermediate_bytes(self, a: ActivationShape) -> float:
        """Projection outputs kept, bf16: GELU input and output; SwiGLU gate, up and product."""
        return (self.n_up + 1) * 2.0 * a.tokens * self.ffn

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        sbh = float(a.tokens * self.hidden)
        mlp = (self.n_up + 1) * 2 * sbh * self.ffn / self.hidden
        if RecomputeModule.ACT in policy.modules:  # the activation output, one intermediate
            mlp -= 2.0 * a.tokens * self.ffn
        if policy.eager_hf and self.gated:  # eager SwiGLU also keeps silu(gate)
            mlp += 2.0 * a.tokens * self.ffn
        mask = 1.0 * a.tokens * self.hidden if a.dropout else 0.0  # output dropout mask, 1 B
        return SavedBytes(replicated=mask, sharded=mlp)

    def wgrad_input_bytes(self, a: ActivationShape) -> float:
        """Sharded bytes the weight gradients read besides the MLP input: the down-projection input."""
        return 2.0 * a.tokens * self.ffn

    def up_output_elements(self, a: ActivationShape) -> float:
        """Elements per token of the up-projection output on one rank before /t (its gradient dY)."""
        return self.n_up * self.ffn


@dataclass(frozen=True, slots=True)
class MoE(Component):
    """Mixture-of-experts MLP: router h→E, E routed experts of width ``expert_ffn`` (top-k per token),
    ``n_shared`` shared experts of width ``shared_ffn`` (DeepSeekMoE; HF modeling_mixtral.py,
    modeling_gpt_oss.py, DeepSeek modeling_deepseek.py)."""

    hidden: int
    n_experts: int
    top_k: int
    expert_ffn: int
    gated: bool
    n_shared: int = 0
    shared_ffn: int = 0
    router_bias: bool = False
    expert_bias: bool = False

    @property
    def n_up(self) -> int:
        """Input-side projections of one expert: 2 gated, 1 ungated."""
        return 2 if self.gated else 1

    def expert_params(self) -> int:
        """One routed expert: (n_up + 1)·h·f_e, plus biases (GPT-OSS gate_up_proj_bias, down_proj_bias)."""
        bias = self.n_up * self.expert_ffn + self.hidden if self.expert_bias else 0
        return (self.n_up + 1) * self.hidden * self.expert_ffn + bias

    def shared_params(self) -> int:
        """All shared experts, n_s·(n_up + 1)·h·f_s (DeepseekV3MoE.shared_experts; no biases)."""
        return self.n_shared * (self.n_up + 1) * self.hidden * self.shared_ffn

    def router_params(self) -> int:
        """Router E·h, plus E with a bias (GptOssTopKRouter; DeepSeek e_score_correction_bias)."""
        return self.n_experts * self.hidden + (self.n_experts if self.router_bias else 0)

    def routed_params(self) -> int:
        """Routed-expert parameters (what expert parallelism shards)."""
        return self.n_experts * self.expert_params()

    def params(self) -> int:
        return self.router_params() + self.routed_params() + self.shared_params()

    def active_params(self) -> int:
        return self.router_params() + self.top_k * self.expert_params() + self.shared_params()

    def gemm_weights_per_token(self) -> int:
        # Megatron num_floating_point_operations MoE branch: router GEMM + top-k routed + shared experts.
        routed = self.top_k * (self.n_up + 1) * self.hidden * self.expert_ffn
        shared = self.n_shared * (self.n_up + 1) * self.hidden * self.shared_ffn
        return self.hidden * self.n_experts + routed + shared

    def intermediate_bytes(self, a: ActivationShape) -> float:
        """Bytes on the busiest EP rank before /t: per routed copy (tokens x top_k x ``expert_load``) the
        permuted input (2h) and the expert intermediates (2 per projection output); shared experts as a
        dense MLP; the router's fp32 probabilities (4 x E per token). Megatron-core ``MoELayer``."""
        tokens = float(a.tokens)
        n_mlp = self.n_up + 1
        copies = tokens * self.top_k * a.expert_load
        routed = copies * (2.0 * self.hidden + n_mlp * 2.0 * self.expert_ffn)
        shared = n_mlp * 2.0 * tokens * self.n_shared * self.shared_ffn
        return routed + shared + 4.0 * tokens * self.n_experts

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        mlp = self.intermediate_bytes(a)
        if RecomputeModule.ACT in policy.modules:
            mlp -= 2.0 * a.tokens * (self.top_k * self.expert_ffn + self.n_shared * self.shared_ffn)
        mask = 1.0 * a.tokens * self.hidden if a.dropout else 0.0
        return SavedBytes(replicated=mask, sharded=mlp)

    def wgrad_input_bytes(self, a: ActivationShape) -> float:
        """Sharded bytes the expert weight gradients read: routed copies' inputs and intermediates."""
        copies = a.tokens * self.top_k
        return copies * 2.0 * (self.hidden + self.expert_ffn) + 2.0 * a.tokens * self.n_shared * self.shared_ffn

    def up_output_elements(self, a: ActivationShape) -> float:
        """Elements per token of the routed up-projection outputs on the busiest rank, before /t."""
        return self.top_k * a.expert_load * self.n_up * self.expert_ffn


@dataclass(frozen=True, slots=True)
class Projection(Component):
    """A standalone linear layer (DeepSeek-V3 MTP's M_k, HF ``eh_proj``)."""

    linear: Linear

    def linears(self) -> tuple[Linear, ...]:
        return (self.linear,)


@dataclass(frozen=True, slots=True)
class Embedding(Component):
    """A V x h table: token embedding (a lookup, no FLOPs) or, ``head``, the LM head GEMM h→V."""

    rows: int
    hidden: int
    head: bool = False

    def params(self) -> int:
        return self.rows * self.hidden

    def gemm_weights_per_token(self) -> int:
        return self.hidden * self.rows if self.head else 0


@dataclass(frozen=True, slots=True)
class LayerDesc:
    """One block as its components in forward order (pre-norm: norm, attention, norm, MLP/MoE)."""

    components: tuple[Component, ...]

    def of(self, cls: type[Component]) -> list[Component]:
        """The components that are instances of ``cls``."""
        return [c for c in self.components if isinstance(c, cls)]

    @property
    def attention(self) -> Attention:
        """The block's attention (ValueError if it has none or several)."""
        found = [c for c in self.components if isinstance(c, Attention)]
        if len(found) != 1:
            raise ValueError(f"block has {len(found)} attention components; expected one")
        return found[0]

    @property
    def ffn(self) -> MLP | MoE:
        """The block's MLP or MoE (ValueError if it has none or several)."""
        found = [c for c in self.components if isinstance(c, MLP | MoE)]
        if len(found) != 1:
            raise ValueError(f"block has {len(found)} MLP/MoE components; expected one")
        return found[0]

    def params(self) -> int:
        """Parameters of the block, elements."""
        return sum(c.params() for c in self.components)

    def active_params(self) -> int:
        """Parameters of the block one token uses."""
        return sum(c.active_params() for c in self.components)

    def routed_params(self) -> int:
        """Parameters held by routed experts (0 without MoE)."""
        return sum(c.routed_params() for c in self.components if isinstance(c, MoE))

    def gemm_weights_per_token(self) -> int:
        """GEMM weights one token multiplies through in this block."""
        return sum(c.gemm_weights_per_token() for c in self.components)

    def forward_flops_per_token(self, seq_len: int) -> float:
        """Forward model FLOPs per token: 2 x GEMM weights + sequence-dependent (attention) terms."""
        return 2 * self.gemm_weights_per_token() + sum(c.seq_flops_per_token(seq_len) for c in self.components)

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        """Bytes the block keeps for backward, summed over components in forward order."""
        total = SavedBytes()
        for c in self.components:
            total = total + c.saved(a, policy)
        return total
