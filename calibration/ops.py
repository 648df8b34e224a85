"""The operations the compute benchmarks time, as the eager PyTorch stack runs them.

The software stack calibrated here is ``eager_hf``: the eager PyTorch composites that Hugging Face
transformers' Llama (and most eager training code) executes:

- RMSNorm: upcast to fp32, mean of squares, rsqrt, scale, downcast, times the weight (HF
  ``LlamaRMSNorm``); LayerNorm: ``F.layer_norm``;
- SwiGLU: ``silu(gate) * up``; GELU: ``F.gelu(x, approximate="tanh")``;
- RoPE: ``q * cos + rotate_half(q) * sin`` on queries and keys (HF ``apply_rotary_pos_emb``);
- attention: projections viewed as (b, s, heads, d), transposed, ``F.scaled_dot_product_attention``
  (causal, ``enable_gqa`` for grouped KV heads), transposed back (HF ``sdpa_attention_forward``);
- cross-entropy: ``F.cross_entropy`` on fp32 logits (HF ``ForCausalLMLoss`` upcasts);
- embedding: ``F.embedding``; the optimizer: ``torch.optim.AdamW`` with its defaults.

``EagerLlama`` is a compact Llama built from the same pieces; the calibration uses one of its
layers for the layer-step memory measurement, and ``device_check`` falls back to it when
transformers is not installed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the usual alias
from torch import nn

RMS_EPS = 1e-6  # HF LlamaConfig.rms_norm_eps default is 1e-6


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """RMSNorm as HF ``LlamaRMSNorm.forward`` computes it (fp32 statistics)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def norm(x: torch.Tensor, weight: torch.Tensor, kind: str) -> torch.Tensor:
    """RMSNorm or LayerNorm (``kind`` is the ModelSpec's ``norm``)."""
    if kind == "rmsnorm":
        return rms_norm(x, weight)
    return F.layer_norm(x, (x.shape[-1],), weight)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension (HF ``rotate_half``)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of queries and keys (HF ``apply_rotary_pos_emb``)."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_tables(s: int, d: int, dtype: torch.dtype, device: torch.device,
                theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (1, 1, s, d) for RoPE (HF ``LlamaRotaryEmbedding``, Llama 3 theta)."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    freqs = torch.arange(s, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]


def activation(x: torch.Tensor, up: torch.Tensor | None, kind: str) -> torch.Tensor:
    """SwiGLU ``silu(x) * up`` or GELU (tanh approximation, GPT-2) of the MLP."""
    if kind == "swiglu":
        assert up is not None
        return F.silu(x) * up
    return F.gelu(x, approximate="tanh")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA from (b, s, heads, d) projections to (b, s, heads * d), as HF's sdpa path runs it."""
    b, s, heads, d = q.shape
    gqa = k.shape[2] != heads
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=gqa)
    return out.transpose(1, 2).reshape(b, s, heads * d)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy on fp32 logits (HF upcasts the logits before the loss)."""
    return F.cross_entropy(logits.float(), target)


class EagerLlamaLayer(nn.Module):
    """One Llama decoder layer built from the ops above (pre-norm attention and SwiGLU MLP)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, head_dim: int | None = None):
        super().__init__()
        d = head_dim or hidden // heads
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.norm1 = nn.Parameter(torch.ones(hidden))
        self.norm2 = nn.Parameter(torch.ones(hidden))
        self.q = nn.Linear(hidden, heads * d, bias=False)
        self.k = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o = nn.Linear(heads * d, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = rms_norm(x, self.norm1)
        q = self.q(h).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = rms_norm(x, self.norm2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class EagerLlama(nn.Module):
    """A Llama causal LM from ``EagerLlamaLayer`` (untied embeddings); ``forward`` returns the mean token
    cross-entropy (the last position of each sequence has no label, as in HF)."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int,
                 head_dim: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(EagerLlamaLayer(hidden, heads, kv_heads, ffn, head_dim) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(hidden))
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.d = head_dim or hidden // heads

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        cos, sin = rope_tables(ids.shape[1], self.d, x.dtype, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.head(rms_norm(x, self.norm))
        # the labels shifted as HF's ForCausalLMLoss does (transformers/loss/loss_utils.py): padded with
        # the ignore index and sliced, so the loss runs on every position's logits, without a copy of them
        labels = F.pad(ids, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
