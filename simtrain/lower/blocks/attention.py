"""Kernels of a layer's self-attention on one TP rank: its projections, read from the layer description
(``simtrain.spec.layer_desc.Attention``, ``LatentAttention``), the attention core (FlashAttention, unfused, sliding
window) and its context-parallel exchange.

GEMM shapes per rank (T tokens, column-parallel N / row-parallel K divided by t): QKV (T, (q+2kv)/t, h),
out-proj (T, h, a*d_v/t); MLA's down projections are replicated, its up projections column-parallel
(Megatron-core). Backward runs dgrad (m, k, n) and wgrad (k, n, m) for each (Narayanan et al. 2021 appendix:
backward = 2x forward FLOPs).
"""

from __future__ import annotations

from simtrain.lower.blocks.segments import Comm, Ring, Segment
from simtrain.lower.blocks.shape import BlockShape, column_parallel
from simtrain.lower.kernels import FLASH_BLOCK, Attention, Gemm, KernelDesc, MemoryBound
from simtrain.spec.collective_kinds import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER, RING_SHIFT
from simtrain.spec.layer_desc import Attention as AttentionComponent
from simtrain.spec.layer_desc import AttentionCore, LatentAttention, TPStyle


class AttentionKernels(BlockShape):
    """The attention kernels of ``BlockShape``'s micro-batch (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    @property
    def _attn(self) -> AttentionComponent:
        """The block's attention as the layer description has it (its projections and core; the window
        is per layer: ``model.layer(i)``)."""
        return self.model.layer().attention

    @property
    def _attn_core(self) -> AttentionCore:
        """The attention core: query heads, query/key and value widths (the window is per layer)."""
        return self._attn.core

    def _projection_dims(self) -> list[tuple[str, int, int]]:
        """(name, in, out) per rank of each attention projection (``Linear.per_rank`` of the layer description).

        Megatron-core MLA: the low-rank down projections (``*_a_*``) are replicated on every TP rank,
        the up projections are column-parallel and ``o_proj`` is row-parallel.
        """
        return [(lin.name, *lin.per_rank(self.t)) for lin in self._attn.projections]

    def _attn_in_fwd(self, c: AttentionComponent) -> tuple[KernelDesc, ...]:
        """QKV projection(s) of the forward: one fused GEMM of the column-parallel q/k/v projections, or
        MLA's down/up projections one by one."""
        h = c.hidden
        if not isinstance(c, LatentAttention):
            n = sum(lin.per_rank(self.t)[1] for lin in c.projections if lin.tp == TPStyle.COL)
            return (self._gemm_fwd("qkv", n, h, gathered=True),)
        return tuple(self._linear_fwd(lin, gathered=lin.d_in == h)  # the projections of the layer input
                     for lin in c.projections if column_parallel(lin))

    def _attn_in_bwd(self, c: AttentionComponent) -> tuple[KernelDesc, ...]:
        if not isinstance(c, LatentAttention):
            n = sum(lin.per_rank(self.t)[1] for lin in c.projections if lin.tp == TPStyle.COL)
            return self._gemm_bwd("qkv", n, c.hidden)
        return tuple(k for lin in reversed(c.projections) if column_parallel(lin) for k in self._linear_bwd(lin))

    def _o_in(self, c: AttentionComponent) -> int:
        """Input width of the output projection on this rank (a*d_v/t)."""
        return c.core.heads * c.core.d_v // self.t

    def _rope(self, c: AttentionComponent, backward: bool) -> tuple[KernelDesc, ...]:
        """RoPE on this rank's queries and keys (read and write, bf16); none without rotary positions."""
        if self.model.position != "rope":
            return ()
        return (MemoryBound("rope.bwd" if backward else "rope", 2 * 2.0 * self.T * (c.q_dim // self.t + c.kv_dim // self.t)),)

    def attention_forward(self, c: AttentionComponent, layer: int | None) -> list[Segment]:
        """Projections in (and RoPE), the core with its CP exchange, the output projection."""
        return [(*self._attn_in_fwd(c), *self._rope(c, False)), *self._attention_segments(False, layer),
                (self._gemm_fwd("out_proj", c.hidden, self._o_in(c)),)]

    def attention_backward(self, c: AttentionComponent, layer: int | None) -> list[Segment]:
        """The forward's mirror; its last segment is RoPE's backward, then the projections' (column-parallel)."""
        rope = self._rope(c, True)
        return [self._gemm_bwd("out_proj", c.hidden, self._o_in(c)), *self._attention_segments(True, layer),
                (*rope, *self._attn_in_bwd(c))]

    def _attention_core(self, backward: bool) -> tuple[KernelDesc, ...]:
        """The attention kernels of this rank's queries against ``s_kv`` keys (no CP exchange)."""
        m = self.model
        heads = self._attn_core.heads // self.t
        kv_heads = max(m.kv_heads // self.t, 1)
        if self.flash:
            return (self._flash(backward, self.s, self.s, heads, kv_heads),)
        # Unfused (Megatron "core attention"): QK^T, masked softmax (+dropout), attention x V.
        batch = self.b * heads
        scores = 2.0 * batch * self.s * self.s
        qk = Gemm("attn.qk", self.s, self.s, self._attn_core.d_qk, batch)
        av = Gemm("attn.av", self.s, self._attn_core.d_qk, self.s, batch)
        soft = MemoryBound("attn.softmax", (3 if backward else 2) * scores + (scores / 2 if self.dropout else 0))
        if backward:
            return (av, av, soft, qk, qk)
        return (qk, soft, av)

    def _flash(self, backward: bool, s_q: int, s_kv: int, heads: int, kv_heads: int) -> KernelDesc:
        name = "flash_attn.bwd" if backward else "flash_attn.fwd"
        # scores use the query/key width, attention x V the value width (MLA: 192 and 128): the kernel's
        # 4*s*s*d FLOPs count both GEMMs, so d is their mean (exact for FLOPs; FA2 convention)
        d = (self._attn_core.d_qk + self._attn_core.d_v) // 2
        return Attention(name, self.b, s_q, s_kv, heads, kv_heads, d,
                                         causal=True, backward=backward)

    def _windowed(self, backward: bool, window: int) -> Segment:
        """Sliding-window attention (GPT-OSS, Mistral): each query sees its last ``window`` keys, so the
        kernel does s x w of the s x s scores (FlashAttention's local window; model FLOPs count
        w - w^2/(2s) keys per query, the same to within w/2s)."""
        heads, kv_heads = self._attn_core.heads // self.t, max(self.model.kv_heads // self.t, 1)
        name = "flash_attn.bwd" if backward else "flash_attn.fwd"
        d = (self._attn_core.d_qk + self._attn_core.d_v) // 2
        # the kernel visits every key block that meets a query block's window: w / B + 1 blocks of B keys
        # (flash-attn's local mainloop, n_block_min = (m_block * B - window) / B), masked or not, so a
        # 128-key window on 128-key blocks does twice the work it keeps
        keys = min(window + FLASH_BLOCK, self.s)
        return (Attention(name, self.b, self.s, keys, heads, kv_heads, d, causal=False,
                                          backward=backward),)

    def _attention_segments(self, backward: bool, layer: int | None = None) -> list[Segment]:
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
        window = self.model.layer(layer).attention.core.window if layer is not None else None
        if self.cp == 1 and window is not None and window < self.s and self.flash:
            return [self._windowed(backward, window)]
        if self.cp == 1:
            return [self._attention_core(backward)]
        m = self.model
        heads, kv_heads = self._attn_core.heads // self.t, max(m.kv_heads // self.t, 1)
        kv_bytes = 2.0 * 2.0 * self.T * kv_heads * self._attn_core.d_qk  # K and V of the local tokens, bf16
        if self.cp_comm == "p2p" and self.torch_cp:
            return self._torch_ring(backward, heads)
        if self.cp_comm == "p2p":
            step = (self._flash(backward, self.s, self.s, heads, kv_heads), self._ring_merge(backward, heads, kv_heads))
            return [Ring(self.cp, step, Comm(RING_SHIFT, kv_bytes * (2 if backward else 1), "cp"))]
        if self.cp_comm == "all_gather":
            core: list[Segment] = [Comm(ALL_GATHER, kv_bytes * self.cp, "cp"),
                                   (self._flash(backward, self.s, self.s * self.cp, heads, kv_heads),)]
            return [*core, Comm(REDUCE_SCATTER, kv_bytes * self.cp, "cp")] if backward else core
        s_full = self.s * self.cp
        qkv = 2.0 * self.T * (heads + 2 * kv_heads) * self._attn_core.d_qk
        out = 2.0 * self.T * heads * self._attn_core.d_qk
        attn = (self._flash(backward, s_full, s_full, heads // self.cp, max(kv_heads // self.cp, 1)),)
        first, last = (out, qkv) if backward else (qkv, out)
        return [Comm(ALL_TO_ALL, first, "cp"), attn, Comm(ALL_TO_ALL, last, "cp")]

    def _torch_ring(self, backward: bool, heads: int) -> list[Segment]:
        """torch's ring attention (``torch_cp``): the expanded K and V all-gathered beside the first block,
        then ``cp`` blocks with their merges and concatenations; in backward the fp32 dK, dV ring."""
        d = self._attn_core.d_qk
        kv = 2.0 * self.T * heads * d  # K and V elements of the local tokens, expanded to the query heads
        flash = self._flash(backward, self.s, self.s, heads, heads)
        merge_k = self._ring_merge(backward, heads, heads)
        cat = MemoryBound("cp_cat.bwd" if backward else "cp_cat",
                                  2.0 * kv * (2.0 + (4.0 if backward else 0.0)))  # read + write bf16 KV (+ fp32 dKV)
        gather = Comm(ALL_GATHER, 2.0 * kv * self.cp, "cp", overlap=True)
        hop = Comm(RING_SHIFT, 4.0 * kv, "cp") if backward else None
        return [gather, Ring(self.cp, (flash, merge_k, cat), hop)]

    def _ring_merge(self, backward: bool, heads: int, kv_heads: int) -> KernelDesc:
        """One ring step's merge into the running result, 10 bytes per element when fused (read the step's
        bf16 partial, read and write the fp32 accumulator; the stack scales it when eager): forward, the
        output rescaled by the step's log-sum-exp (TE ``flash_attn_fwd_out_correction``; torch
        ``_SDPAMerger.step``); backward, dQ, dK and dV added into their accumulators. With causal load
        balancing a step off the diagonal touches half of the queries (step <= rank: all queries, half the
        keys; else half the queries, all keys; TE ``AttnFuncWithCPAndKVP2P``), so the mean step merges
        (1 + 0.75 (cp - 1)) / cp of the full tensors."""
        share = (1.0 + 0.75 * (self.cp - 1)) / self.cp
        elems = self.T * heads * self._attn_core.d_v
        if backward:
            elems = self.T * (heads + 2 * kv_heads) * self._attn_core.d_qk
        return MemoryBound("cp_merge.bwd" if backward else "cp_merge", 10.0 * share * elems)
