"""Model specification: decoder-only transformers (dense and MoE) and their parameter counts.

``ModelSpec.layer(i)`` turns the spec into the one description of block i
(``simtrain.spec.layer_desc.LayerDesc``: norms, attention, MLP or MoE, each knowing its weights, FLOPs
and saved activations); every parameter count here is derived from it, as are the model FLOPs
(``simtrain.lower.flops``) and the saved activations (``simtrain.lower.memory``). Presets are
``simtrain.spec.model_presets``; ``simtrain.spec.model`` re-exports both and the HF loader.

All sizes are element counts (parameters, dimensions), not bytes. Dense parameter counters follow
Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``,
NVIDIA/Megatron-LM @00caa53): GQA via (1 + g/a), SwiGLU via a third projection, LayerNorm as two
vectors and RMSNorm as one. Unlike that estimator, biases are counted exactly, so the totals match
the published (checkpoint) counts of GPT-2, Llama 2/3, Mistral, Qwen2 and Pythia.

Mixture-of-experts (``moe``), DeepSeek multi-head latent attention (``mla``) and multi-token
prediction (``mtp_depth``) are optional parts; with none of them set a model is dense and every
count below is the dense one. Module structure and names follow the Hugging Face ``transformers``
modeling files cited at each component (``modeling_llama.py``, ``modeling_mixtral.py``,
``modeling_qwen3.py``, ``modeling_gpt_oss.py``) and DeepSeek's ``modeling_deepseek.py``
(deepseek-ai/DeepSeek-V3 on HF).

Layer indices are 0-based, as in the HF modules (``model.layers.{i}``); MTP depth k (1-based, as in
the DeepSeek-V3 report §2.2) holds block index ``n_layers + k - 1`` (HF ``model.layers.61``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simtrain.spec.layer_desc import (
    MLP,
    Attention,
    AttentionCore,
    Embedding,
    LatentAttention,
    LayerDesc,
    Linear,
    MoE,
    Norm,
    NormKind,
    Projection,
    TPStyle,
)

__all__ = ["AttentionKind", "MLASpec", "ModelSpec", "MoESpec"]

AttentionKind = Literal["full", "sliding"]


class MoESpec(BaseModel):
    """Mixture-of-experts MLP: routed experts with top-k routing, optional shared experts.

    Which layers are MoE: layer i is MoE iff ``i >= first_k_dense``, ``i % layer_freq == 0`` and
    ``i not in dense_layers`` (DeepSeek ``modeling_deepseek.py`` DeepseekV3DecoderLayer; Qwen's
    ``mlp_only_layers``/``decoder_sparse_step`` are converted to ``dense_layers`` at load). Dense
    layers use the model's ``ffn_hidden``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    n_experts: int = Field(gt=0)
    """Routed experts per MoE layer E (HF n_routed_experts / num_local_experts / num_experts)."""
    top_k: int = Field(gt=0)
    """Routed experts each token is sent to, k (HF num_experts_per_tok)."""
    ffn_hidden: int = Field(gt=0)
    """Inner width of one routed expert, elements (HF moe_intermediate_size; Mixtral intermediate_size)."""
    n_shared_experts: int = Field(default=0, ge=0)
    """Always-active shared experts per MoE layer (DeepSeekMoE, Dai et al. 2024 §3.2)."""
    shared_ffn_hidden: int | None = Field(default=None, gt=0)
    """Inner width of one shared expert, elements; None means ``ffn_hidden``."""
    first_k_dense: int = Field(default=0, ge=0)
    """Leading layers whose MLP is dense (HF first_k_dense_replace; DeepSeek-V3: 3)."""
    layer_freq: int = Field(default=1, gt=0)
    """Every ``layer_freq``-th layer (i % layer_freq == 0) is MoE (HF moe_layer_freq)."""
    dense_layers: tuple[int, ...] = ()
    """Further layer indices whose MLP is dense (HF Qwen ``mlp_only_layers``)."""
    router_bias: bool = False
    """Router carries one bias per expert (GPT-OSS router bias; DeepSeek-V3 e_score_correction_bias)."""
    expert_bias: bool = False
    """Expert projections carry biases (GPT-OSS gate_up_proj_bias and down_proj_bias)."""
    n_group: int = Field(default=1, gt=0)
    """Expert groups for group-limited routing (HF n_group; DeepSeek-V3: 8, one per node of its EP64)."""
    topk_group: int = Field(default=1, gt=0)
    """Groups a token may be routed into (HF topk_group; DeepSeek-V3: 4, "at most 4 nodes", sec. 3.2.2)."""

    @property
    def group_limited(self) -> bool:
        """Whether routing limits each token to ``topk_group`` of ``n_group`` expert groups."""
        return self.n_group > 1 and self.topk_group < self.n_group

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        if any(i < 0 for i in self.dense_layers):
            raise ValueError("dense_layers holds a negative layer index")
        return self

    @property
    def shared_ffn(self) -> int:
        """Inner width of one shared expert, elements."""
        return self.ffn_hidden if self.shared_ffn_hidden is None else self.shared_ffn_hidden


class MLASpec(BaseModel):
    """DeepSeek multi-head latent attention dims (DeepSeek-V2 §2.1; DeepSeek-V3 report §2.1.1)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    q_lora_rank: int | None = Field(gt=0)
    """Query compression rank d_c' (1536 in V3); None: plain q_proj h→a·d_qk (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = Field(gt=0)
    """Key/value compression rank d_c (512 in V3), elements."""
    qk_nope_head_dim: int = Field(gt=0)
    """Per-head query/key width without RoPE d_h (128 in V3), elements."""
    qk_rope_head_dim: int = Field(gt=0)
    """Per-head decoupled RoPE query/key width d_h^R (64 in V3), elements; the key part is shared."""
    v_head_dim: int = Field(gt=0)
    """Per-head value width (128 in V3), elements."""

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width used by the scores, d_h + d_h^R elements."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class ModelSpec(BaseModel):
    """A decoder-only transformer (GPT / Llama family), dense or mixture-of-experts.

    Meaning of the dense-era accessors for the newer parts:

    - ``ffn_hidden``/``mlp_params()``: the *dense* MLP, used by the dense layers only (for an
      all-MoE model such as Mixtral it mirrors HF ``intermediate_size`` and no layer uses it);
      the MoE MLP is ``moe_params()``/``expert_params()``; ``ffn_params(i)`` picks per layer.
    - ``d_head``/``q_dim``/``kv_dim``: query/key widths (MLA: d_h + d_h^R per head, after the
      up-projection); value widths are ``v_head_dim``/``v_dim`` (equal to the key ones without MLA).
    - ``attention_params()``: the whole attention module of one block (projections, biases, MLA's
      latent norms, q/k norms, sinks); the same in every layer.
    - ``layer_params(i)``: block i; without ``i`` only when every block is alike (see
      ``layers_alike``), else ValueError.
    - ``param_count()``: the main model (DeepSeek's 671B); MTP modules are ``mtp_params()``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str
    """Human-readable name, e.g. ``llama3-8b``."""
    n_layers: int = Field(gt=0)
    """Number of transformer blocks (MTP blocks not included)."""
    hidden: int = Field(gt=0)
    """Model (residual stream) width h, elements."""
    n_heads: int = Field(gt=0)
    """Number of query heads a."""
    n_kv_heads: int | None = Field(default=None, gt=0)
    """Number of key/value heads g (GQA); None means g = a (multi-head attention)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width d_h, elements; None means hidden // n_heads (MLA: derived from ``mla``)."""
    ffn_hidden: int = Field(gt=0)
    """Dense MLP inner width f, elements (per projection for SwiGLU); dense layers only."""
    activation: Literal["gelu", "swiglu"]
    """MLP activation: GELU (two matrices) or SwiGLU (three matrices: gate, up, down)."""
    norm: Literal["layernorm", "rmsnorm"]
    """Normalisation: LayerNorm (weight + bias) or RMSNorm (weight only)."""
    position: Literal["learned", "rope", "alibi"]
    """Position encoding; only ``learned`` has parameters."""
    vocab: int = Field(gt=0)
    """Vocabulary size V (padded size as used in the embedding table), tokens."""
    max_position: int = Field(default=4096, gt=0)
    """Maximum sequence length, tokens; sizes the learned position table only."""
    tied_embeddings: bool
    """Whether the LM head shares the input embedding matrix."""
    linear_bias: bool
    """GPT-style biases on QKV, attention output and both MLP projections."""
    qkv_bias: bool = False
    """Bias on the QKV projection only (Qwen2); implied by ``linear_bias``."""
    attn_out_bias: bool = False
    """Bias on the attention output projection (GPT-OSS, HF ``attention_bias``); implied by ``linear_bias``."""
    qk_norm: bool = False
    """RMSNorm over d_h on queries and keys, one weight vector each (Qwen3 q_norm/k_norm)."""
    attn_sinks: bool = False
    """One learned attention-sink logit per query head (GPT-OSS ``sinks``)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Window w of sliding-window layers, tokens (a query sees itself and the w-1 keys before it)."""
    attention_pattern: tuple[AttentionKind, ...] = Field(default=("full",), min_length=1)
    """Attention kind of each layer, repeated cyclically: layer i is ``pattern[i % len(pattern)]``
    (GPT-OSS: ("sliding", "full"), HF ``layer_types``)."""
    moe: MoESpec | None = None
    """Mixture-of-experts MLP; None for a dense model."""
    mla: MLASpec | None = None
    """DeepSeek multi-head latent attention; None for MHA/GQA."""
    mtp_depth: int = Field(default=0, ge=0)
    """Multi-token prediction modules D (DeepSeek-V3 §2.2; HF num_nextn_predict_layers)."""

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        errors: list[str] = []
        if self.head_dim is None and self.mla is None and self.hidden % self.n_heads:
            errors.append(f"n_heads={self.n_heads} does not divide hidden={self.hidden}; set head_dim")
        if self.kv_heads > self.n_heads or self.n_heads % self.kv_heads:
            errors.append(f"n_kv_heads={self.kv_heads} must divide n_heads={self.n_heads}")
        if self.mla is not None:
            if self.kv_heads != self.n_heads:
                errors.append("mla: keys/values are per query head; n_kv_heads must equal n_heads")
            if self.head_dim is not None:
                errors.append("mla: leave head_dim unset (the head dims are mla's)")
            if self.linear_bias or self.qkv_bias or self.attn_out_bias or self.qk_norm or self.attn_sinks:
                errors.append("mla: attention biases, q/k norms and sinks are not modelled with MLA")
        if "sliding" in self.attention_pattern and self.sliding_window is None:
            errors.append("attention_pattern has sliding layers; set sliding_window")
        if self.sliding_window is not None and "sliding" not in self.attention_pattern:
            errors.append("sliding_window is set but attention_pattern has no sliding layer")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    # ---- derived dimensions ------------------------------------------------------------------

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads g (equals n_heads without GQA)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        """Per-head query/key width, elements (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.hidden // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def v_head_dim(self) -> int:
        """Per-head value width, elements (MLA: mla.v_head_dim; else d_head)."""
        return self.mla.v_head_dim if self.mla is not None else self.d_head

    @property
    def q_dim(self) -> int:
        """Width of the query projection output, a·d_h elements."""
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of the key projection output (and of the value one without MLA), g·d_h elements."""
        return self.kv_heads * self.d_head

    @property
    def v_dim(self) -> int:
        """Width of the value projection output, g·d_v elements (the attention output is a·d_v)."""
        return self.kv_heads * self.v_head_dim

    @property
    def is_moe(self) -> bool:
        """Whether the model has mixture-of-experts layers."""
        return self.moe is not None

    @property
    def layers_alike(self) -> bool:
        """Whether every block has the same parameters (no dense/MoE mix)."""
        return self.moe is None or len({self.is_moe_layer(i) for i in range(self.n_layers)}) == 1

    # ---- per-layer structure -----------------------------------------------------------------

    def is_moe_layer(self, i: int) -> bool:
        """Whether block i (0-based; MTP blocks are n_layers, n_layers+1, …) has an MoE MLP."""
        # DeepSeek modeling_deepseek.py DeepseekV3DecoderLayer: MoE iff n_routed_experts and
        # layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0.
        m = self.moe
        return m is not None and i >= m.first_k_dense and i % m.layer_freq == 0 and i not in m.dense_layers

    def moe_layer_indices(self) -> list[int]:
        """Indices of the MoE blocks of the main model, ascending."""
        return [i for i in range(self.n_layers) if self.is_moe_layer(i)]

    def dense_layer_indices(self) -> list[int]:
        """Indices of the dense-MLP blocks of the main model, ascending."""
        return [i for i in range(self.n_layers) if not self.is_moe_layer(i)]

    def attention_kind(self, i: int) -> AttentionKind:
        """Attention of block i: ``full`` (causal over the whole sequence) or ``sliding``."""
        return self.attention_pattern[i % len(self.attention_pattern)]

    def attention_window(self, i: int) -> int | None:
        """Keys a query of block i may see, tokens, itself included; None means unlimited (causal)."""
        return self.sliding_window if self.attention_kind(i) == "sliding" else None

    # ---- the layer description ---------------------------------------------------------------

    def norm_component(self) -> Norm:
        """One of the block's norms (LayerNorm: gain + bias; RMSNorm: gain), also the final norm."""
        return Norm(self.hidden, NormKind(self.norm))

    def attention_component(self, window: int | None = None) -> Attention:
        """The self-attention of a block with sliding ``window`` (None: causal over the sequence).

        MHA/GQA: q/k/v/o_proj (HF modeling_llama.py LlamaAttention); QKV biases (GPT-2/3, Qwen2,
        GPT-OSS), output bias (GPT, GPT-OSS ``attention_bias``), Qwen3 q_norm/k_norm over d_h
        (modeling_qwen3.py), GPT-OSS ``sinks`` per head (modeling_gpt_oss.py). MLA: DeepSeek
        modeling_deepseek.py DeepseekV3Attention (DeepSeek-V3 report §2.1.1, eqs. 1-11): q_a_proj
        h→d_c', q_b_proj d_c'→a·(d_h+d_h^R) (or q_proj h→a·(d_h+d_h^R) without q compression),
        kv_a_proj_with_mqa h→d_c+d_h^R (latent + shared RoPE key), kv_b_proj d_c→a·(d_h+d_v),
        o_proj a·d_v→h, and the q_a_layernorm (d_c') and kv_a_layernorm (d_c) RMSNorms.
        """
        h, a = self.hidden, self.n_heads
        core = AttentionCore(heads=a, d_qk=self.d_head, d_v=self.v_head_dim, window=window)
        mla = self.mla
        if mla is None:
            qkv_b = self.linear_bias or self.qkv_bias
            out_b = self.linear_bias or self.attn_out_bias
            projections = (Linear("q_proj", h, self.q_dim, TPStyle.COL, qkv_b),
                           Linear("k_proj", h, self.kv_dim, TPStyle.COL, qkv_b),
                           Linear("v_proj", h, self.kv_dim, TPStyle.COL, qkv_b),
                           Linear("o_proj", self.q_dim, h, TPStyle.ROW, out_b))  # fmt: skip
            extra = (2 * self.d_head if self.qk_norm else 0) + (a if self.attn_sinks else 0)
            return Attention(h, self.q_dim, self.kv_dim, core, projections, extra)
        q: tuple[Linear, ...]
        if mla.q_lora_rank is None:
            q = (Linear("q_proj", h, a * mla.qk_head_dim),)
        else:
            q = (Linear("q_a_proj", h, mla.q_lora_rank, TPStyle.REP),
                 Linear("q_b_proj", mla.q_lora_rank, a * mla.qk_head_dim))  # fmt: skip
        projections = (*q, Linear("kv_a_proj_with_mqa", h, mla.kv_lora_rank + mla.qk_rope_head_dim, TPStyle.REP),
                       Linear("kv_b_proj", mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim)),
                       Linear("o_proj", a * mla.v_head_dim, h, TPStyle.ROW))  # fmt: skip
        extra = (mla.q_lora_rank or 0) + mla.kv_lora_rank
        return LatentAttention(h, self.q_dim, self.kv_dim, core, projections, extra,
                               q_latent=mla.q_lora_rank, kv_latent=mla.kv_lora_rank,
                               rope_dim=mla.qk_rope_head_dim)  # fmt: skip

    def dense_mlp_component(self) -> MLP:
        """The dense MLP h→f→h: GELU (Vaswani 2017, GPT-2/3) or SwiGLU gate+up+down (Shazeer 2020)."""
        return MLP(self.hidden, self.ffn_hidden, gated=self.activation == "swiglu", bias=self.linear_bias)

    def moe_component(self) -> MoE:
        """The MoE MLP (HF MixtralSparseMoeBlock, GptOssMLP, DeepseekV3MoE); ValueError without MoE."""
        m = self._moe()
        return MoE(self.hidden, m.n_experts, m.top_k, m.ffn_hidden, gated=self.activation == "swiglu",
                   n_shared=m.n_shared_experts, shared_ffn=m.shared_ffn, router_bias=m.router_bias,
                   expert_bias=m.expert_bias)  # fmt: skip

    def layer(self, i: int | None = None) -> LayerDesc:
        """Block i (0-based; MTP blocks n_layers, …) as its components in forward order: pre-norm,
        attention, pre-norm, MLP or MoE. ``i`` None: the dense block (dense MLP, no window).

        A model with another block type overrides this (or ``build_layer``); every count, FLOP and
        saved byte follows (tests/test_layer_desc.py ``HybridSpec``).
        """
        moe = i is not None and self.is_moe_layer(i)
        return _cached_layer(self, moe, None if i is None else self.attention_window(i))

    def build_layer(self, moe: bool, window: int | None) -> LayerDesc:
        """A block with an MoE (``moe``) or dense MLP and attention ``window`` (None: causal)."""
        ffn = self.moe_component() if moe else self.dense_mlp_component()
        norm = self.norm_component()
        return LayerDesc((norm, self.attention_component(window), norm, ffn))

    def _moe(self) -> MoESpec:
        if self.moe is None:
            raise ValueError(f"model {self.name!r} has no MoE layers")
        return self.moe

    # ---- attention (elements) ----------------------------------------------------------------

    def attention_projections(self) -> list[tuple[str, int, int]]:
        """The attention GEMM weights of one block as (HF module name, in_dim, out_dim)."""
        return [(lin.name, lin.d_in, lin.d_out) for lin in self.attention_component().linears()]

    def attention_gemm_params(self) -> int:
        """Weights of the attention projections of one block (no biases, norms or sinks)."""
        return self.attention_component().gemm_weights_per_token()

    def attention_params(self) -> int:
        """Parameters of one self-attention block (projections, biases, norms inside it, sinks)."""
        return self.attention_component().params()

    # ---- MLPs (elements) ---------------------------------------------------------------------

    def mlp_params(self) -> int:
        """Parameters of one dense MLP block (GELU: 2·h·f; SwiGLU: 3·h·f; plus biases)."""
        return self.dense_mlp_component().params()

    def expert_params(self) -> int:
        """Parameters of one routed expert: (n_in + 1)·h·f_e, plus biases where the model has them."""
        return self.moe_component().expert_params()

    def shared_expert_params(self) -> int:
        """Parameters of all shared experts of one MoE layer, n_s·(n_in + 1)·h·f_s (no biases)."""
        return self.moe_component().shared_params()

    def router_params(self) -> int:
        """Parameters of the router (gate) of one MoE layer: E·h, plus E with a router bias."""
        return self.moe_component().router_params()

    def moe_params(self) -> int:
        """Parameters of one MoE MLP: router + E routed experts + shared experts."""
        return self.moe_component().params()

    def moe_active_params(self) -> int:
        """Parameters of one MoE MLP a token uses: router + top-k routed experts + shared experts."""
        return self.moe_component().active_params()

    def ffn_params(self, i: int) -> int:
        """Parameters of the MLP of block i (MoE or dense)."""
        return self.layer(i).ffn.params()

    def layer_routed_expert_params(self, i: int) -> int:
        """Parameters of block i held by its routed experts (what EP shards); 0 for a dense block."""
        return self.layer(i).routed_params()

    def routed_expert_param_count(self, include_mtp: bool = False) -> int:
        """Routed-expert parameters of the whole model (the rest is replicated or TP-sharded)."""
        blocks = self.n_layers + (self.mtp_depth if include_mtp else 0)
        return sum(self.layer_routed_expert_params(i) for i in range(blocks))

    def ffn_active_params(self, i: int) -> int:
        """Parameters of the MLP of block i that one token uses."""
        return self.layer(i).ffn.active_params()

    # ---- blocks and the whole model (elements) -----------------------------------------------

    def norm_params_per_layer(self) -> int:
        """Parameters of the norms of one block (before attention and before the MLP)."""
        return sum(c.params() for c in self.layer().of(Norm))

    def _layer_index(self, i: int | None) -> int:
        """Resolve the optional layer index of the per-layer counters."""
        if i is not None:
            return i
        if not self.layers_alike:
            raise ValueError(
                f"{self.name}: blocks differ (dense layers {self.dense_layer_indices()}); pass a layer index"
            )
        return 0

    def layer_params(self, i: int | None = None) -> int:
        """Parameters of block i; without ``i`` the block shared by every layer (ValueError if none is)."""
        return self.layer(self._layer_index(i)).params()

    def layer_active_params(self, i: int | None = None) -> int:
        """Parameters of block i that one token uses (top-k routed + shared experts for MoE)."""
        return self.layer(self._layer_index(i)).active_params()

    def embedding_component(self) -> Embedding:
        """The input token embedding, V x h (a lookup: no FLOPs)."""
        return Embedding(self.vocab, self.hidden)

    def lm_head_component(self) -> Embedding:
        """The LM head h→V (its weights are the embedding's when tied)."""
        return Embedding(self.vocab, self.hidden, head=True)

    def embedding_params(self) -> int:
        """Parameters of the input token embedding, V·h."""
        return self.embedding_component().params()

    def position_params(self) -> int:
        """Parameters of the learned position table (max_position·h); 0 for RoPE and ALiBi."""
        # GPT-2/3 learned absolute positions; Megatron counts s·h (Narayanan 2021, appendix).
        return Embedding(self.max_position, self.hidden).params() if self.position == "learned" else 0

    def lm_head_params(self) -> int:
        """Parameters of the output projection, V·h; 0 when tied to the input embedding."""
        # Megatron theoretical_memory_usage.py: the output layer is added when untied.
        return 0 if self.tied_embeddings else self.lm_head_component().params()

    def final_norm_params(self) -> int:
        """Parameters of the final norm before the LM head."""
        return self.norm_component().params()

    def non_embedding_params(self) -> int:
        """Parameters excluding token/position embeddings, the LM head and MTP (Kaplan et al. 2020 N)."""
        if self.layers_alike:
            return self.n_layers * self.layer_params() + self.final_norm_params()
        return sum(self.layer_params(i) for i in range(self.n_layers)) + self.final_norm_params()

    # ---- multi-token prediction (elements) ---------------------------------------------------

    def mtp_projection(self) -> Linear:
        """M_k of an MTP module: [RMSNorm(h); RMSNorm(Emb)] (2h) → h (HF ``eh_proj``, no bias)."""
        return Linear("eh_proj", 2 * self.hidden, self.hidden)

    def mtp_around_block(self) -> LayerDesc:
        """What an MTP module holds besides its block: enorm, hnorm, eh_proj and shared_head.norm
        (DeepSeek-V3 README_WEIGHTS.md); embedding and LM head are the main model's."""
        norm = self.norm_component()
        return LayerDesc((norm, norm, Projection(self.mtp_projection()), norm))

    def mtp_module_params(self, k: int = 1) -> int:
        """Unique parameters of MTP module k (1-based): its block + M_k (2h→h) + three RMSNorms.

        DeepSeek-V3 report §2.2: h'_i = M_k[RMSNorm(h_i^{k-1}); RMSNorm(Emb(t_{i+k}))], then TRM_k;
        embedding and output head are shared with the main model (not counted). HF checkpoint
        (DeepSeek-V3 README_WEIGHTS.md): enorm, hnorm, eh_proj, a block like the main ones,
        shared_head.norm.
        """
        if not 1 <= k <= self.mtp_depth:
            raise ValueError(f"MTP module {k} outside 1..{self.mtp_depth}")
        return self.layer_params(self.n_layers + k - 1) + self.mtp_around_block().params()

    def mtp_module_active_params(self, k: int = 1) -> int:
        """Parameters of MTP module k one token uses (shared embedding and head not counted)."""
        if not 1 <= k <= self.mtp_depth:
            raise ValueError(f"MTP module {k} outside 1..{self.mtp_depth}")
        return self.layer_active_params(self.n_layers + k - 1) + self.mtp_around_block().params()

    def mtp_params(self) -> int:
        """Unique parameters of all MTP modules (0 without MTP)."""
        return sum(self.mtp_module_params(k) for k in range(1, self.mtp_depth + 1))

    # ---- totals ------------------------------------------------------------------------------

    def param_count(self, include_mtp: bool = False) -> int:
        """Total number of parameters of the main model; MTP modules too with ``include_mtp``.

        DeepSeek-V3 README: 671B main model + 14B MTP = 685B on HF (the HF checkpoint also stores
        copies of the shared embedding and head in the MTP layer; ``include_mtp`` counts them once).
        """
        total = (
            self.non_embedding_params()
            + self.embedding_params()
            + self.position_params()
            + self.lm_head_params()
        )
        return total + (self.mtp_params() if include_mtp else 0)

    def active_param_count(self, include_input_embedding: bool = True, include_mtp: bool = False) -> int:
        """Parameters one token uses: attention, dense MLPs, top-k routed + shared experts, norms, head.

        Publishers differ on the input embedding (a lookup: a token reads one row of it):
        Mistral (Mixtral 12.9B/39B) and Qwen3 count it; DeepSeek-V3 (README_WEIGHTS.md: 36.6B
        "including 0.9B for the output Head") and OpenAI (gpt-oss model card, 5.13B) do not. The
        LM head always counts (it is a GEMM per token); when tied it is the embedding matrix, so
        ``include_input_embedding`` adds nothing more. For a dense model with the default
        arguments this equals ``param_count()``.
        """
        if self.layers_alike:
            body = self.n_layers * self.layer_active_params()
        else:
            body = sum(self.layer_active_params(i) for i in range(self.n_layers))
        head = self.embedding_params() if self.tied_embeddings else self.lm_head_params()
        inputs = 0
        if include_input_embedding:
            inputs = self.position_params() + (0 if self.tied_embeddings else self.embedding_params())
        mtp = 0
        if include_mtp:
            mtp = sum(self.mtp_module_active_params(k) for k in range(1, self.mtp_depth + 1))
        return body + self.final_norm_params() + head + inputs + mtp


@lru_cache(maxsize=1024)
def _cached_layer(model: ModelSpec, moe: bool, window: int | None) -> LayerDesc:
    """Blocks of a model differ only by MLP kind and attention window: each is built once.

    Keyed by the (frozen, hashable) spec's field values, so a ``model_copy(update=...)`` gets its own.
    """
    return model.build_layer(moe, window)
