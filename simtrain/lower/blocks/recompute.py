"""Kernels a layer's recompute re-runs before its backward: Megatron's selective recompute of chosen modules
and torchtitan's op-level selective activation checkpointing (``simtrain.lower.memory`` counts what each
keeps).
"""

from __future__ import annotations

from simtrain.lower.blocks.attention import AttentionKernels
from simtrain.lower.blocks.moe import MoEKernels
from simtrain.lower.blocks.segments import Comm, Segment, merge
from simtrain.lower.kernels import KernelDesc, MemoryBound
from simtrain.lower.memory import op_sac_recomputed
from simtrain.spec.collective_kinds import ALL_GATHER, ALL_REDUCE
from simtrain.spec.layer_desc import MLP, LatentAttention, MoE, TPStyle


class RecomputeKernels(AttentionKernels, MoEKernels):
    """Recompute kernels of a layer (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    def selective_recompute(self, layer: int | None, modules: tuple[str, ...]) -> tuple[KernelDesc, ...]:
        """Kernels selective recompute re-runs before a layer's backward (see memory._selective_recompute)."""
        out: list[KernelDesc] = []
        if "core_attn" in modules and not self.flash:
            out += self._attention_core(backward=False)
        if "layernorm" in modules:
            out += [self._norm("ln1.recompute", False), self._norm("ln2.recompute", False)]
        if "mla_up_proj" in modules and isinstance(self._attn, LatentAttention):  # the up projections
            out += [self._gemm_fwd(lin.name + ".recompute", lin.per_rank(self.t)[1], lin.per_rank(self.t)[0])
                    for lin in self._attn.projections if lin.tp == TPStyle.COL]
        if "act" in modules:
            ffn = self.model.layer(layer).ffn
            n_up = ffn.n_up
            if not isinstance(ffn, MoE):
                out.append(MemoryBound("act.recompute", (n_up + 1) * 2.0 * self.T * (ffn.ffn // self.t)))
            else:
                tokens, k, local, m_e, f_e, f_s = self._moe_dims(ffn)
                out.append(MemoryBound("expert.act.recompute", (n_up + 1) * 2.0 * m_e * local * f_e))
                if f_s:
                    out.append(MemoryBound("shared.act.recompute", (n_up + 1) * 2.0 * tokens * f_s))
        return tuple(out)

    def _op_sac_recompute(self, layer: int | None) -> list[Segment]:
        """Segments torchtitan's op-level SAC re-runs before a layer's backward (``memory.op_sac_linears``):
        the matmuls it does not save (every second one) and every other op but attention: the norms,
        RoPE, residual adds and the activation (unfused attention also its scores and softmax).

        Its save list holds TP ``reduce_scatter_tensor`` but not ``all_gather_into_tensor``
        (torchtitan ``_save_list``, llama3 ``parallelize.py``, 2024-2025), so with TP and SP the replay
        re-runs the all-gather of each norm output the column-parallel matmuls read (their inputs are
        needed for the weight gradients and are not saved): one before the attention and, in a dense
        layer, one before the MLP (an MoE layer's tokens enter it sequence-sharded). Without SP the
        all-reduce after the attention is re-run instead: the second norm's recompute reads its sum."""
        m = self.model
        moe = isinstance(m.layer(layer).ffn, MoE)
        q, kv = self._attn.q_dim // self.t, self._attn.kv_dim // self.t
        dense = m.layer().ffn
        assert isinstance(dense, MLP)
        f, n_up = dense.ffn // self.t, dense.n_up
        attn: list[KernelDesc | None] = []
        mlp: list[KernelDesc | None] = []
        for name, d_in, d_out, style in op_sac_recomputed(m, layer):
            n = d_out // self.t if style == "col" else d_out
            side = mlp if name in ("w1", "w2", "w3") else attn
            side.append(self._gemm_fwd(name + ".recompute", n, d_in // self.t if style == "row" else d_in,
                                       gathered=style == "col"))
        if m.position == "rope":
            attn.append(MemoryBound("rope.recompute", 2 * 2.0 * self.T * (q + kv)))
        if not self.flash:
            attn += self._attention_core(backward=False)
        if not moe:
            mlp.append(MemoryBound("act.recompute", (n_up + 1) * 2.0 * self.T * f))
        ln1, ln2 = self._norm("ln1.recompute", False), self._norm("ln2.recompute", False)
        res1 = self._residual("residual1.recompute", False)
        size = 2.0 * self.T * m.hidden
        if self.t == 1:
            return merge([(ln1, *attn, res1, ln2, *mlp)])
        if not self.sp:
            return merge([(ln1, *attn), Comm(ALL_REDUCE, size), (res1, ln2, *mlp)])
        gather = self._gather_bytes(size)
        mlp_gather: list[Segment] = [] if moe else [Comm(ALL_GATHER, gather)]
        return merge([(ln1,), Comm(ALL_GATHER, gather), tuple(attn), (res1, ln2), *mlp_gather, tuple(mlp)])
