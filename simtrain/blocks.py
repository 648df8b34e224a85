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
    """A TP-group collective between compute segments."""

    coll: str
    size_bytes: float


Segment = tuple[Kernel, ...] | Comm


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
        m = self.model
        heads = m.n_heads // self.t
        kv_heads = max(m.kv_heads // self.t, 1)
        if self.flash:
            name = "flash_attn.bwd" if backward else "flash_attn.fwd"
            return (self.cost.flash_attention(name, self.b, self.s, self.s, heads, kv_heads, m.d_head,
                                              causal=True, backward=backward),)
        # Unfused (Megatron "core attention"): QK^T, masked softmax (+dropout), attention x V.
        batch = self.b * heads
        scores = 2.0 * batch * self.s * self.s
        qk = self.cost.gemm("attn.qk", self.s, self.s, m.d_head, batch)
        av = self.cost.gemm("attn.av", self.s, m.d_head, self.s, batch)
        soft = self.cost.memory_op("attn.softmax", (3 if backward else 2) * scores + (scores / 2 if self.dropout else 0))
        if backward:
            return (av, av, soft, qk, qk)
        return (qk, soft, av)

    def attention_core_recompute(self) -> tuple[Kernel, ...]:
        """Kernels re-run by selective recompute (unfused attention only)."""
        return self._attention_core(backward=False)

    def layer_forward(self) -> list[Segment]:
        """Forward segments of one transformer layer."""
        h, q, kv, f, n_up = self._dims
        ln1, ln2 = self._norm("ln1", False), self._norm("ln2", False)
        rope = (self.cost.memory_op("rope", 2 * 2.0 * self.T * (q + kv)),) if self.model.position == "rope" else ()
        attn = (self._gemm_fwd("qkv", q + 2 * kv, h), *rope, *self._attention_core(False),
                self._gemm_fwd("out_proj", h, q))
        act = self.cost.memory_op("act", (n_up + 1) * 2.0 * self.T * f)
        mlp = (self._gemm_fwd("mlp_up", n_up * f, h), act, self._gemm_fwd("mlp_down", h, f))
        res1, res2 = self._residual("residual1", False), self._residual("residual2", False)
        size = 2.0 * self.T * h
        pre_mlp = tuple(k for k in (res1, ln2) if k is not None)
        if self.t == 1:
            return [(ln1, *attn, *pre_mlp, *mlp, *(() if res2 is None else (res2,)))]
        if not self.sp:
            return [(ln1, *attn), Comm("all_reduce", size), (*pre_mlp, *mlp), Comm("all_reduce", size),
                    tuple(k for k in (res2,) if k is not None)]
        return [(ln1,), Comm("all_gather", size), attn, Comm("reduce_scatter", size), pre_mlp,
                Comm("all_gather", size), mlp, Comm("reduce_scatter", size),
                tuple(k for k in (res2,) if k is not None)]

    def layer_backward(self) -> list[Segment]:
        """Backward segments of one transformer layer (reverse order of the forward)."""
        h, q, kv, f, n_up = self._dims
        rope = (self.cost.memory_op("rope.bwd", 2 * 2.0 * self.T * (q + kv)),) if self.model.position == "rope" else ()
        attn = (*self._gemm_bwd("out_proj", h, q), *self._attention_core(True), *rope,
                *self._gemm_bwd("qkv", q + 2 * kv, h))
        act = self.cost.memory_op("act.bwd", (2 * n_up + 1) * 2.0 * self.T * f)
        mlp = (*self._gemm_bwd("mlp_down", h, f), act, *self._gemm_bwd("mlp_up", n_up * f, h))
        res1, res2 = self._residual("residual1.bwd", True), self._residual("residual2.bwd", True)
        ln1, ln2 = self._norm("ln1.bwd", True), self._norm("ln2.bwd", True)
        r2 = tuple(k for k in (res2,) if k is not None)
        mid = tuple(k for k in (ln2, res1) if k is not None)
        size = 2.0 * self.T * h
        if self.t == 1:
            return [(*r2, *mlp, *mid, *attn, ln1)]
        if not self.sp:
            return [(*r2, *mlp), Comm("all_reduce", size), (*mid, *attn), Comm("all_reduce", size), (ln1,)]
        return [r2, Comm("all_gather", size), mlp, Comm("reduce_scatter", size), mid,
                Comm("all_gather", size), attn, Comm("reduce_scatter", size), (ln1,)]

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
