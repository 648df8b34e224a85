"""Model specification: decoder-only transformers (dense and MoE), parameter counts, presets.

Hugging Face ``config.json`` loading is ``simtrain.hf_config`` (``from_hf_config`` is re-exported here).

All sizes are element counts (parameters, dimensions), not bytes. Dense parameter counters follow
Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``,
NVIDIA/Megatron-LM @00caa53): GQA via (1 + g/a), SwiGLU via a third projection, LayerNorm as two
vectors and RMSNorm as one. Unlike that estimator, biases are counted exactly, so the totals match
the published (checkpoint) counts of GPT-2, Llama 2/3, Mistral, Qwen2 and Pythia.

Mixture-of-experts (``moe``), DeepSeek multi-head latent attention (``mla``) and multi-token
prediction (``mtp_depth``) are optional parts; with none of them set a model is dense and every
count below is the dense one. Module structure and names follow the Hugging Face ``transformers``
modeling files cited at each counter (``modeling_mixtral.py``, ``modeling_qwen3_moe.py``,
``modeling_gpt_oss.py``) and DeepSeek's ``modeling_deepseek.py`` (deepseek-ai/DeepSeek-V3 on HF).

Layer indices are 0-based, as in the HF modules (``model.layers.{i}``); MTP depth k (1-based, as in
the DeepSeek-V3 report §2.2) holds block index ``n_layers + k - 1`` (HF ``model.layers.61``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simtrain.errors import ConfigError, problem

__all__ = [
    "MLASpec",
    "ModelSpec",
    "MoESpec",
    "list_presets",
    "preset",
    "preset_table",
]

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

    # ---- attention (elements) ----------------------------------------------------------------

    def attention_projections(self) -> list[tuple[str, int, int]]:
        """The attention GEMM weights of one block as (HF module name, in_dim, out_dim).

        MHA/GQA: q/k/v/o_proj (HF modeling_llama.py LlamaAttention). MLA: DeepSeek
        modeling_deepseek.py DeepseekV3Attention (DeepSeek-V3 report §2.1.1, eqs. 1-11): q_a_proj
        h→d_c', q_b_proj d_c'→a·(d_h+d_h^R) (or q_proj h→a·(d_h+d_h^R) without q compression),
        kv_a_proj_with_mqa h→d_c+d_h^R (latent + shared RoPE key), kv_b_proj d_c→a·(d_h+d_v),
        o_proj a·d_v→h.
        """
        h, mla = self.hidden, self.mla
        if mla is None:
            return [("q_proj", h, self.q_dim), ("k_proj", h, self.kv_dim), ("v_proj", h, self.kv_dim),
                    ("o_proj", self.q_dim, h)]  # fmt: skip
        a = self.n_heads
        if mla.q_lora_rank is None:
            q = [("q_proj", h, a * mla.qk_head_dim)]
        else:
            q = [("q_a_proj", h, mla.q_lora_rank), ("q_b_proj", mla.q_lora_rank, a * mla.qk_head_dim)]
        return [
            *q,
            ("kv_a_proj_with_mqa", h, mla.kv_lora_rank + mla.qk_rope_head_dim),
            ("kv_b_proj", mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim)),
            ("o_proj", a * mla.v_head_dim, h),
        ]

    def attention_gemm_params(self) -> int:
        """Weights of the attention projections of one block (no biases, norms or sinks)."""
        return sum(i * o for _, i, o in self.attention_projections())

    def attention_params(self) -> int:
        """Parameters of one self-attention block (projections, biases, norms inside it, sinks)."""
        if self.mla is not None:
            # modeling_deepseek.py: q_a_layernorm (d_c') and kv_a_layernorm (d_c) RMSNorms; no biases.
            q_norm = self.mla.q_lora_rank or 0
            return self.attention_gemm_params() + q_norm + self.mla.kv_lora_rank
        # Megatron theoretical_memory_usage.py: 2·h²·(1 + g/a) for Q,K,V,O when a·d_h = h; written
        # here with q_dim/kv_dim so a head_dim ≠ h/a (e.g. Mistral-Nemo) is also exact.
        qkv = self.hidden * (self.q_dim + 2 * self.kv_dim)
        out = self.q_dim * self.hidden
        bias = 0
        if self.linear_bias or self.qkv_bias:  # QKV bias: GPT-2/3 (Radford 2019), Qwen2, GPT-OSS
            bias += self.q_dim + 2 * self.kv_dim
        if self.linear_bias or self.attn_out_bias:  # output-projection bias: GPT, GPT-OSS
            bias += self.hidden
        extra = 0
        if self.qk_norm:  # HF modeling_qwen3.py Qwen3Attention: q_norm, k_norm = RMSNorm(head_dim)
            extra += 2 * self.d_head
        if self.attn_sinks:  # HF modeling_gpt_oss.py GptOssAttention: sinks = Parameter(n_heads)
            extra += self.n_heads
        return qkv + out + bias + extra

    # ---- MLPs (elements) ---------------------------------------------------------------------

    def _n_in(self) -> int:
        """Input-side projections of one MLP: 2 for SwiGLU (gate, up), 1 for GELU."""
        return 2 if self.activation == "swiglu" else 1

    def mlp_params(self) -> int:
        """Parameters of one dense MLP block (GELU: 2·h·f; SwiGLU: 3·h·f; plus biases)."""
        # GELU MLP h→f→h (Vaswani 2017, GPT-2/3); SwiGLU gate+up+down (Shazeer 2020, Llama paper §2.2).
        # Megatron theoretical_memory_usage.py: ×3/2 for gated linear units.
        n_in = self._n_in()
        weights = (n_in + 1) * self.hidden * self.ffn_hidden
        bias = n_in * self.ffn_hidden + self.hidden if self.linear_bias else 0
        return weights + bias

    def _moe(self) -> MoESpec:
        if self.moe is None:
            raise ValueError(f"model {self.name!r} has no MoE layers")
        return self.moe

    def expert_params(self) -> int:
        """Parameters of one routed expert: (n_in + 1)·h·f_e, plus biases where the model has them."""
        # HF modeling_mixtral.py MixtralBlockSparseTop2MLP w1/w2/w3 (no bias); modeling_gpt_oss.py
        # GptOssExperts: gate_up_proj h×2f + bias 2f, down_proj f×h + bias h, per expert.
        m = self._moe()
        n_in = self._n_in()
        bias = n_in * m.ffn_hidden + self.hidden if m.expert_bias else 0
        return (n_in + 1) * self.hidden * m.ffn_hidden + bias

    def shared_expert_params(self) -> int:
        """Parameters of all shared experts of one MoE layer, n_s·(n_in + 1)·h·f_s (no biases)."""
        # DeepSeek modeling_deepseek.py DeepseekV3MoE.shared_experts: one MLP of width
        # moe_intermediate_size × n_shared_experts, i.e. the same count as n_s experts of width f_s.
        m = self._moe()
        return m.n_shared_experts * (self._n_in() + 1) * self.hidden * m.shared_ffn

    def router_params(self) -> int:
        """Parameters of the router (gate) of one MoE layer: E·h, plus E with a router bias."""
        # HF MixtralSparseMoeBlock.gate Linear(h, E, bias=False); GptOssTopKRouter weight E×h + bias E;
        # DeepSeek MoEGate weight E×h + e_score_correction_bias E (topk_method noaux_tc).
        m = self._moe()
        return m.n_experts * self.hidden + (m.n_experts if m.router_bias else 0)

    def moe_params(self) -> int:
        """Parameters of one MoE MLP: router + E routed experts + shared experts."""
        return (
            self.router_params() + self._moe().n_experts * self.expert_params() + self.shared_expert_params()
        )

    def moe_active_params(self) -> int:
        """Parameters of one MoE MLP a token uses: router + top-k routed experts + shared experts."""
        return self.router_params() + self._moe().top_k * self.expert_params() + self.shared_expert_params()

    def ffn_params(self, i: int) -> int:
        """Parameters of the MLP of block i (MoE or dense)."""
        return self.moe_params() if self.is_moe_layer(i) else self.mlp_params()

    def layer_routed_expert_params(self, i: int) -> int:
        """Parameters of block i held by its routed experts (what EP shards); 0 for a dense block."""
        return self._moe().n_experts * self.expert_params() if self.is_moe_layer(i) else 0

    def routed_expert_param_count(self, include_mtp: bool = False) -> int:
        """Routed-expert parameters of the whole model (the rest is replicated or TP-sharded)."""
        blocks = self.n_layers + (self.mtp_depth if include_mtp else 0)
        return sum(self.layer_routed_expert_params(i) for i in range(blocks))

    def ffn_active_params(self, i: int) -> int:
        """Parameters of the MLP of block i that one token uses."""
        return self.moe_active_params() if self.is_moe_layer(i) else self.mlp_params()

    # ---- blocks and the whole model (elements) -----------------------------------------------

    def _norm_params(self) -> int:
        # LayerNorm: gain + bias (Ba et al. 2016); RMSNorm: gain only (Zhang & Sennrich 2019).
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def norm_params_per_layer(self) -> int:
        """Parameters of the two pre-norms of one block (before attention and before the MLP)."""
        # Megatron theoretical_memory_usage.py: 2 norms per layer, ×2 for LayerNorm.
        return 2 * self._norm_params()

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
        i = self._layer_index(i)
        return self.attention_params() + self.ffn_params(i) + self.norm_params_per_layer()

    def layer_active_params(self, i: int | None = None) -> int:
        """Parameters of block i that one token uses (top-k routed + shared experts for MoE)."""
        i = self._layer_index(i)
        return self.attention_params() + self.ffn_active_params(i) + self.norm_params_per_layer()

    def embedding_params(self) -> int:
        """Parameters of the input token embedding, V·h."""
        return self.vocab * self.hidden

    def position_params(self) -> int:
        """Parameters of the learned position table (max_position·h); 0 for RoPE and ALiBi."""
        # GPT-2/3 learned absolute positions; Megatron counts s·h (Narayanan 2021, appendix).
        return self.max_position * self.hidden if self.position == "learned" else 0

    def lm_head_params(self) -> int:
        """Parameters of the output projection, V·h; 0 when tied to the input embedding."""
        # Megatron theoretical_memory_usage.py: the output layer is added when untied.
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def final_norm_params(self) -> int:
        """Parameters of the final norm before the LM head."""
        return self._norm_params()

    def non_embedding_params(self) -> int:
        """Parameters excluding token/position embeddings, the LM head and MTP (Kaplan et al. 2020 N)."""
        if self.layers_alike:
            return self.n_layers * self.layer_params() + self.final_norm_params()
        return sum(self.layer_params(i) for i in range(self.n_layers)) + self.final_norm_params()

    # ---- multi-token prediction (elements) ---------------------------------------------------

    def mtp_module_params(self, k: int = 1) -> int:
        """Unique parameters of MTP module k (1-based): its block + M_k (2h→h) + three RMSNorms.

        DeepSeek-V3 report §2.2: h'_i = M_k[RMSNorm(h_i^{k-1}); RMSNorm(Emb(t_{i+k}))], then TRM_k;
        embedding and output head are shared with the main model (not counted). HF checkpoint
        (DeepSeek-V3 README_WEIGHTS.md): enorm, hnorm, eh_proj, a block like the main ones,
        shared_head.norm.
        """
        if not 1 <= k <= self.mtp_depth:
            raise ValueError(f"MTP module {k} outside 1..{self.mtp_depth}")
        proj = 2 * self.hidden * self.hidden
        return self.layer_params(self.n_layers + k - 1) + proj + 3 * self._norm_params()

    def mtp_module_active_params(self, k: int = 1) -> int:
        """Parameters of MTP module k one token uses (shared embedding and head not counted)."""
        if not 1 <= k <= self.mtp_depth:
            raise ValueError(f"MTP module {k} outside 1..{self.mtp_depth}")
        proj = 2 * self.hidden * self.hidden
        return self.layer_active_params(self.n_layers + k - 1) + proj + 3 * self._norm_params()

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


# ---- presets -----------------------------------------------------------------------------------


def _gpt(
    name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048
) -> Callable[[], ModelSpec]:
    """GPT-2/3 / Megatron GPT: f = 4h, GELU, LayerNorm, learned positions, tied, biases."""

    def make() -> ModelSpec:
        return ModelSpec(
            name=name, n_layers=layers, hidden=hidden, n_heads=heads, ffn_hidden=4 * hidden,
            activation="gelu", norm="layernorm", position="learned", vocab=vocab,
            max_position=seq, tied_embeddings=True, linear_bias=True,
        )  # fmt: skip

    return make


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, ctx: int
) -> Callable[[], ModelSpec]:
    """Llama: SwiGLU, RMSNorm, RoPE, untied, no biases (Touvron et al. 2023; Llama 3 herd 2024)."""

    def make() -> ModelSpec:
        return ModelSpec(
            name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
            ffn_hidden=ffn, activation="swiglu", norm="rmsnorm", position="rope", vocab=vocab,
            max_position=ctx, tied_embeddings=False, linear_bias=False,
        )  # fmt: skip

    return make


def _build_presets() -> Mapping[str, Callable[[], ModelSpec]]:
    # Megatron GPT weak-scaling family: Narayanan et al. 2021 (arXiv 2104.04473) Table 1 —
    # (name, hidden, heads, layers); vocab 51200, seq 2048.
    sc21 = [
        ("1.7b", 2304, 24, 24), ("3.6b", 3072, 32, 30), ("7.5b", 4096, 32, 36),
        ("18b", 6144, 48, 40), ("39b", 8192, 64, 48), ("76b", 10240, 80, 60),
        ("145b", 12288, 96, 80), ("310b", 16384, 128, 96), ("530b", 20480, 128, 105),
        ("1t", 25600, 160, 128),
    ]  # fmt: skip
    table: dict[str, Callable[[], ModelSpec]] = {
        f"gpt-{size}": _gpt(f"gpt-{size}", layers, h, a) for size, h, a, layers in sc21
    }
    # GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d 12288, 96 heads, ctx 2048; GPT-2 BPE).
    table["gpt3-175b"] = _gpt("gpt3-175b", 96, 12288, 96, vocab=50257, seq=2048)
    # Llama 2: Touvron et al. 2023 + HF config.json (meta-llama/Llama-2-*-hf).
    table["llama2-7b"] = _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096)
    table["llama2-13b"] = _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096)
    table["llama2-70b"] = _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096)
    # Llama 3 / 3.1: "The Llama 3 Herd of Models" Table 3 + HF config.json (meta-llama/*).
    table["llama3-8b"] = _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192)
    table["llama3-70b"] = _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192)
    table["llama3.1-8b"] = _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072)
    table["llama3.1-70b"] = _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072)
    table["llama3.1-405b"] = _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072)
    table.update(_moe_presets())
    return MappingProxyType(table)


def _moe_presets() -> dict[str, Callable[[], ModelSpec]]:
    """MoE presets; every value is the HF ``config.json`` of the model named in the comment."""
    llama_like: dict[str, Any] = {
        "activation": "swiglu", "norm": "rmsnorm", "position": "rope", "tied_embeddings": False,
        "linear_bias": False,
    }  # fmt: skip
    table: dict[str, Callable[[], ModelSpec]] = {}
    # mistralai/Mixtral-8x7B-v0.1 config.json (Jiang et al. 2024, arXiv 2401.04088, Table 1).
    table["mixtral-8x7b"] = partial(
        ModelSpec, name="mixtral-8x7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
        ffn_hidden=14336, vocab=32000, max_position=32768, **llama_like,
        moe=MoESpec(n_experts=8, top_k=2, ffn_hidden=14336),
    )  # fmt: skip
    # mistral-community/Mixtral-8x22B-v0.1 config.json (Mistral AI, "Cheaper, Better, Faster,
    # Stronger", 2024-04-17).
    table["mixtral-8x22b"] = partial(
        ModelSpec, name="mixtral-8x22b", n_layers=56, hidden=6144, n_heads=48, n_kv_heads=8,
        ffn_hidden=16384, vocab=32000, max_position=65536, **llama_like,
        moe=MoESpec(n_experts=8, top_k=2, ffn_hidden=16384),
    )  # fmt: skip
    # deepseek-ai/DeepSeek-V3 config.json (DeepSeek-V3 report, arXiv 2412.19437, §2 and §4.2):
    # MLA, 1 shared + 256 routed experts top-8, first 3 layers dense, 1 MTP module.
    table["deepseek-v3"] = partial(
        ModelSpec, name="deepseek-v3", n_layers=61, hidden=7168, n_heads=128, n_kv_heads=128,
        ffn_hidden=18432, vocab=129280, max_position=163840, **llama_like,
        mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                    v_head_dim=128),
        moe=MoESpec(n_experts=256, top_k=8, ffn_hidden=2048, n_shared_experts=1, first_k_dense=3,
                    router_bias=True, n_group=8, topk_group=4),
        mtp_depth=1,
    )  # fmt: skip
    # Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json (Qwen3 report, arXiv 2505.09388,
    # Table 2): q/k RMSNorm, head_dim 128, 128 experts top-8, no shared experts, all layers MoE
    # (ffn_hidden is HF intermediate_size, used by no layer).
    table["qwen3-30b-a3b"] = partial(
        ModelSpec, name="qwen3-30b-a3b", n_layers=48, hidden=2048, n_heads=32, n_kv_heads=4,
        head_dim=128, ffn_hidden=6144, vocab=151936, max_position=40960, qk_norm=True, **llama_like,
        moe=MoESpec(n_experts=128, top_k=8, ffn_hidden=768),
    )  # fmt: skip
    table["qwen3-235b-a22b"] = partial(
        ModelSpec, name="qwen3-235b-a22b", n_layers=94, hidden=4096, n_heads=64, n_kv_heads=4,
        head_dim=128, ffn_hidden=12288, vocab=151936, max_position=40960, qk_norm=True, **llama_like,
        moe=MoESpec(n_experts=128, top_k=8, ffn_hidden=1536),
    )  # fmt: skip
    # openai/gpt-oss-120b config.json (gpt-oss model card, arXiv 2508.10925, §2.1): biases on
    # q/k/v/o, attention sinks, head_dim 64, sliding window 128 on even layers, 128 experts top-4
    # with router and expert biases.
    table["gpt-oss-120b"] = partial(
        ModelSpec, name="gpt-oss-120b", n_layers=36, hidden=2880, n_heads=64, n_kv_heads=8,
        head_dim=64, ffn_hidden=2880, vocab=201088, max_position=131072, qkv_bias=True,
        attn_out_bias=True, attn_sinks=True, sliding_window=128, attention_pattern=("sliding", "full"),
        **llama_like,
        moe=MoESpec(n_experts=128, top_k=4, ffn_hidden=2880, router_bias=True, expert_bias=True),
    )  # fmt: skip
    return table


_PRESETS: Mapping[str, Callable[[], ModelSpec]] = _build_presets()


def list_presets() -> list[str]:
    """Names of the built-in model presets, in definition order."""
    return list(_PRESETS)


def preset(name: str) -> ModelSpec:
    """Return the preset model ``name`` (case-insensitive); ConfigError at ``model`` if unknown."""
    factory = _PRESETS.get(name.strip().lower())
    if factory is None:
        raise ConfigError(problem("model", name, f"known presets: {', '.join(_PRESETS)}"))
    return factory()


def preset_table() -> list[dict[str, Any]]:
    """One row per preset for a CLI listing.

    ``params_B`` is the total count and ``active_params_B`` the per-token active count
    (``active_param_count()``, input embedding included) in billions (1e9); they are equal for
    dense models. ``ffn`` is the expert width for MoE models and the MLP width otherwise;
    ``experts`` is ``"E/k"`` (routed experts / top-k, ``+s`` shared) for MoE and ``""`` for dense.
    """
    rows = []
    for name in _PRESETS:
        m = preset(name)
        experts = ""
        if m.moe is not None:
            shared = f"+{m.moe.n_shared_experts}" if m.moe.n_shared_experts else ""
            experts = f"{m.moe.n_experts}{shared}/{m.moe.top_k}"
        rows.append(
            {
                "name": name, "params_B": round(m.param_count() / 1e9, 3),
                "active_params_B": round(m.active_param_count() / 1e9, 3), "layers": m.n_layers,
                "hidden": m.hidden, "heads": m.n_heads, "kv_heads": m.kv_heads,
                "ffn": m.moe.ffn_hidden if m.moe is not None else m.ffn_hidden, "vocab": m.vocab,
                "experts": experts,
            }
        )  # fmt: skip
    return rows
