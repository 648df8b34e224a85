"""Kernels of one transformer layer, the embedding and the LM head, per TP rank.

Each builder returns *segments*: a compute segment is a tuple of ``Kernel``; a communication
segment is ``Comm(coll, axis, size_bytes)``. Segments alternate the way Megatron-LM's tensor
parallelism does (Shoeybi et al. 2019, Fig. 3: one all-reduce after the attention and one after the
MLP in forward, mirrored in backward; with sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2)
each all-reduce becomes a reduce-scatter, and an all-gather precedes each column-parallel GEMM).
Collective sizes use the nccl-tests convention (reference Table B): the full b*s*h*2 tensor.

GEMM shapes per rank (m tokens, column-parallel N / row-parallel K divided by t):
QKV (T, (q+2kv)/t, h), out-proj (T, h, q/t), MLP up (T, n_up*f/t, h), MLP down (T, h, f/t),
LM head (T, V/t, h). Backward runs dgrad (m, k, n) and wgrad (k, n, m) for each (Narayanan et al.
2021 appendix: backward = 2x forward FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass

from simtrain.costs import ComputeCostModel
from simtrain.model import ModelSpec
from simtrain.ops import Kernel


@dataclass(frozen=True, slots=True)
class Comm:
    """A collective of the ``axis`` group between compute segments (the next compute waits for it)."""

    coll: str
    size_bytes: float
    axis: str = "tp"


@dataclass(frozen=True, slots=True)
class Ring:
    """Ring attention (context parallelism, ``cp_comm=p2p``): ``steps`` attention blocks; while block
    i is computed, KV block i is passed on to the next CP rank (``comm``), and block i+1 waits for it
    (Liu et al. 2023 "Ring Attention"; Megatron-core ``AttnFuncWithCPAndKVP2P``)."""

    steps: int
    kernels: tuple[Kernel, ...]
    comm: Comm


Segment = tuple[Kernel, ...] | Comm | Ring


def merge(segs: list[Segment | tuple[Kernel | None, ...]]) -> list[Segment]:
    """Concatenate adjacent kernel tuples (dropping None kernels and empty tuples) into one segment."""
    out: list[Segment] = []
    for seg in segs:
        if isinstance(seg, Comm | Ring):
            out.append(seg)
            continue
        kernels = tuple(k for k in seg if k is not None)
        if not kernels:
            continue
        if out and isinstance(out[-1], tuple):
            out[-1] = out[-1] + kernels
        else:
            out.append(kernels)
    return out


@dataclass(frozen=True, slots=True)
class BlockBuilder:
    """Builds the segments of one layer/embedding/head for one micro-batch on one TP rank."""

    model: ModelSpec
    cost: ComputeCostModel
    b: int
    s: int
    t: int
    sp: bool
    flash: bool
    dropout: bool
    cp: int = 1
    cp_comm: str = "p2p"

    @property
    def T(self) -> int:  # noqa: N802 - the paper's symbol for tokens
        """Tokens of one micro-batch (b * s)."""
        return self.b * self.s

    @property
    def Tn(self) -> int:  # noqa: N802
        """Tokens each rank's norms/residuals see (T/t with sequence parallelism)."""
        return self.T // self.t if self.sp else self.T

    def _gemm_fwd(self, name: str, n: int, k: int) -> Kernel:
        return self.cost.gemm(name, self.T, n, k)

    def _gemm_bwd(self, name: str, n: int, k: int) -> tuple[Kernel, Kernel]:
        return (self.cost.gemm(name + ".dgrad", self.T, k, n), self.cost.gemm(name + ".wgrad", k, n, self.T))

    def _norm(self, name: str, backward: bool) -> Kernel:
        n = 3 if backward else 2  # fwd: read x, write y; bwd: read x and dy, write dx
        return self.cost.memory_op(name, n * 2.0 * self.Tn * self.model.hidden)

    def _residual(self, name: str, backward: bool) -> Kernel | None:
        h = self.model.hidden
        if backward:
            return self.cost.memory_op(name, 2 * 2.0 * self.Tn * h + self.Tn * h) if self.dropout else None
        mask = self.Tn * h if self.dropout else 0.0
        return self.cost.memory_op(name, 3 * 2.0 * self.Tn * h + mask)

    @property
    def _dims(self) -> tuple[int, int, int, int, int]:
        m = self.model
        n_up = 2 if m.activation == "swiglu" else 1
        return m.hidden, m.q_dim // self.t, m.kv_dim // self.t, m.ffn_hidden // self.t, n_up

    def _attention_core(self, backward: bool) -> tuple[Kernel, ...]:
        """The attention kernels of this rank's queries against ``s_kv`` keys (no CP exchange)."""
        m = self.model
        heads = m.n_heads // self.t
        kv_heads = max(m.kv_heads // self.t, 1)
        if self.flash:
            return (self._flash(backward, self.s, self.s, heads, kv_heads),)
        # Unfused (Megatron "core attention"): QK^T, masked softmax (+dropout), attention x V.
        batch = self.b * heads
        scores = 2.0 * batch * self.s * self.s
        qk = self.cost.gemm("attn.qk", self.s, self.s, m.d_head, batch)
        av = self.cost.gemm("attn.av", self.s, m.d_head, self.s, batch)
        soft = self.cost.memory_op("attn.softmax", (3 if backward else 2) * scores + (scores / 2 if self.dropout else 0))
        if backward:
            return (av, av, soft, qk, qk)
        return (qk, soft, av)

    def _flash(self, backward: bool, s_q: int, s_kv: int, heads: int, kv_heads: int) -> Kernel:
        name = "flash_attn.bwd" if backward else "flash_attn.fwd"
        return self.cost.flash_attention(name, self.b, s_q, s_kv, heads, kv_heads, self.model.d_head,
                                         causal=True, backward=backward)

    def _attention_segments(self, backward: bool) -> list[Segment]:
        """Core attention with its context-parallel exchange (Megatron ``--cp-comm-type``).

        Every CP rank holds s/cp tokens in two balanced chunks (Megatron-core's causal load balancing:
        chunks i and 2cp-1-i), so each does 1/cp of the causal work:
        - p2p: cp ring steps; each computes the local queries against one KV block (half of a block
          of (s/cp)^2 scores, as causal) while that block (K and V; in backward also dK, dV) moves on.
        - all_gather: K and V all-gathered (backward: gathered again, dK/dV reduce-scattered), then
          the local queries against all s keys, causal (Llama 3 paper sec. 3.3.2).
        - a2a: Q, K, V all-to-all from sequence- to head-sharding, full-sequence attention on
          heads/cp, output all-to-all back (DeepSpeed-Ulysses, Jacobs et al. 2023).
        """
        if self.cp == 1:
            return [self._attention_core(backward)]
        m = self.model
        heads, kv_heads = m.n_heads // self.t, max(m.kv_heads // self.t, 1)
        kv_bytes = 2.0 * 2.0 * self.T * kv_heads * m.d_head  # K and V of the local tokens, bf16
        if self.cp_comm == "p2p":
            step = (self._flash(backward, self.s, self.s, heads, kv_heads),)
            return [Ring(self.cp, step, Comm("ring_shift", kv_bytes * (2 if backward else 1), "cp"))]
        if self.cp_comm == "all_gather":
            core: list[Segment] = [Comm("all_gather", kv_bytes * self.cp, "cp"),
                                   (self._flash(backward, self.s, self.s * self.cp, heads, kv_heads),)]
            return [*core, Comm("reduce_scatter", kv_bytes * self.cp, "cp")] if backward else core
        s_full = self.s * self.cp
        qkv = 2.0 * self.T * (heads + 2 * kv_heads) * m.d_head
        out = 2.0 * self.T * heads * m.d_head
        attn = (self._flash(backward, s_full, s_full, heads // self.cp, max(kv_heads // self.cp, 1)),)
        first, last = (out, qkv) if backward else (qkv, out)
        return [Comm("all_to_all", first, "cp"), attn, Comm("all_to_all", last, "cp")]

    def attention_core_recompute(self) -> tuple[Kernel, ...]:
        """Kernels re-run by selective recompute (unfused attention only)."""
        return self._attention_core(backward=False)

    def layer_forward(self) -> list[Segment]:
        """Forward segments of one transformer layer."""
        h, q, kv, f, n_up = self._dims
        ln1, ln2 = self._norm("ln1", False), self._norm("ln2", False)
        rope = (self.cost.memory_op("rope", 2 * 2.0 * self.T * (q + kv)),) if self.model.position == "rope" else ()
        attn: list[Segment] = [(self._gemm_fwd("qkv", q + 2 * kv, h), *rope), *self._attention_segments(False),
                               (self._gemm_fwd("out_proj", h, q),)]
        act = self.cost.memory_op("act", (n_up + 1) * 2.0 * self.T * f)
        mlp = (self._gemm_fwd("mlp_up", n_up * f, h), act, self._gemm_fwd("mlp_down", h, f))
        res1, res2 = self._residual("residual1", False), self._residual("residual2", False)
        size = 2.0 * self.T * h
        if self.t == 1:
            return merge([(ln1,), *attn, (res1, ln2), mlp, (res2,)])
        if not self.sp:
            return merge([(ln1,), *attn, Comm("all_reduce", size), (res1, ln2), mlp, Comm("all_reduce", size),
                          (res2,)])
        return merge([(ln1,), Comm("all_gather", size), *attn, Comm("reduce_scatter", size), (res1, ln2),
                      Comm("all_gather", size), mlp, Comm("reduce_scatter", size), (res2,)])

    def layer_backward(self) -> list[Segment]:
        """Backward segments of one transformer layer (reverse order of the forward)."""
        h, q, kv, f, n_up = self._dims
        rope = (self.cost.memory_op("rope.bwd", 2 * 2.0 * self.T * (q + kv)),) if self.model.position == "rope" else ()
        attn: list[Segment] = [self._gemm_bwd("out_proj", h, q), *self._attention_segments(True),
                               (*rope, *self._gemm_bwd("qkv", q + 2 * kv, h))]
        act = self.cost.memory_op("act.bwd", (2 * n_up + 1) * 2.0 * self.T * f)
        mlp = (*self._gemm_bwd("mlp_down", h, f), act, *self._gemm_bwd("mlp_up", n_up * f, h))
        res1, res2 = self._residual("residual1.bwd", True), self._residual("residual2.bwd", True)
        ln1, ln2 = self._norm("ln1.bwd", True), self._norm("ln2.bwd", True)
        size = 2.0 * self.T * h
        if self.t == 1:
            return merge([(res2,), mlp, (ln2, res1), *attn, (ln1,)])
        if not self.sp:
            return merge([(res2,), mlp, Comm("all_reduce", size), (ln2, res1), *attn, Comm("all_reduce", size),
                          (ln1,)])
        return merge([(res2,), Comm("all_gather", size), mlp, Comm("reduce_scatter", size), (ln2, res1),
                      Comm("all_gather", size), *attn, Comm("reduce_scatter", size), (ln1,)])

    def embedding_forward(self) -> list[Segment]:
        """Token (+ learned position) embedding; vocab-parallel embeddings reduce across TP."""
        h = self.model.hidden
        kernels = [self.cost.memory_op("embedding", 2 * 2.0 * self.T * h)]
        if self.model.position == "learned":
            kernels.append(self.cost.memory_op("pos_embedding", 3 * 2.0 * self.T * h))
        if self.t == 1:
            return [tuple(kernels)]
        return [tuple(kernels), Comm("reduce_scatter" if self.sp else "all_reduce", 2.0 * self.T * h)]

    def embedding_backward(self) -> list[Segment]:
        """Embedding gradient (scatter-add of the token gradients)."""
        k = (self.cost.memory_op("embedding.bwd", 3 * 2.0 * self.T * self.model.hidden),)
        if self.t > 1 and self.sp:
            return [Comm("all_gather", 2.0 * self.T * self.model.hidden), k]
        return [k]

    def head_forward(self) -> list[Segment]:
        """Final norm, LM head GEMM and cross-entropy (vocab-parallel across TP)."""
        h, v = self.model.hidden, self.model.vocab // self.t
        ln = self._norm("final_norm", False)
        head = (self._gemm_fwd("lm_head", v, h),
                self.cost.memory_op("cross_entropy", self.T * v * (2.0 + 4.0 + 4.0)))
        if self.t == 1:
            return [(ln, *head)]
        pre: list[Segment] = [(ln,), Comm("all_gather", 2.0 * self.T * h)] if self.sp else [(ln,)]
        # vocab-parallel cross-entropy all-reduces the max and the sum of exp per token (fp32)
        return [*pre, head, Comm("all_reduce", 2 * 4.0 * self.T)]

    def head_backward(self) -> list[Segment]:
        """Cross-entropy and LM-head backward, then the final norm's."""
        h, v = self.model.hidden, self.model.vocab // self.t
        ce = self.cost.memory_op("cross_entropy.bwd", self.T * v * (4.0 + 2.0))
        head = (ce, *self._gemm_bwd("lm_head", v, h))
        ln = self._norm("final_norm.bwd", True)
        if self.t == 1:
            return [(*head, ln)]
        return [head, Comm("reduce_scatter" if self.sp else "all_reduce", 2.0 * self.T * h), (ln,)]
