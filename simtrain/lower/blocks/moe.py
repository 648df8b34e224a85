"""Kernels of a mixture-of-experts MLP on one rank, read from the layer description
(``simtrain.spec.layer_desc.MoE``: experts, top-k, widths, shared experts): router, permutation, dispatch and
combine all-to-alls over the EP group, the local experts as grouped GEMMs, the shared experts.
"""

from __future__ import annotations

from simtrain.lower.blocks.segments import Comm, Segment
from simtrain.lower.blocks.shape import BlockShape
from simtrain.lower.kernels import Gemm, KernelDesc, MemoryBound
from simtrain.spec.collective_kinds import (
    ALL_GATHER,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    Collective,
    CollectiveKind,
    NodeLimited,
)
from simtrain.spec.layer_desc import MoE


class MoEKernels(BlockShape):
    """The MoE kernels of ``BlockShape``'s micro-batch (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    @property
    def _moe_tokens(self) -> int:
        """Tokens entering this rank's MoE block: T/t with sequence parallelism (T with t = 1)."""
        return self.T // self.t if self.t > 1 else self.T

    def _moe_dims(self, c: MoE) -> tuple[int, int, int, int, int, int]:
        """(tokens, top_k, local experts, tokens per local expert, expert ffn per rank, shared ffn)."""
        tokens = self._moe_tokens
        local = c.n_experts // self.ep
        # balanced routing: the EP group's tokens x top_k copies spread evenly over all experts, so
        # each rank's experts see tokens x top_k copies; expert TP gathers its etp ranks' copies
        per_expert = max(tokens * c.top_k * self.etp // local, 1)
        return tokens, c.top_k, local, per_expert, c.expert_ffn // self.etp, c.n_shared * c.shared_ffn

    def _experts(self, c: MoE, backward: bool) -> tuple[KernelDesc, ...]:
        """Grouped GEMMs of the local experts (kernels named ``expert.*``: the engine scales them by the
        rank's routed load, see simtrain.plan.routing)."""
        h, n_up = c.hidden, c.n_up
        _, _, local, m_e, f_e, _ = self._moe_dims(c)
        if not backward:
            return (Gemm("expert.up", m_e, n_up * f_e, h, local, grouped=True),
                    MemoryBound("expert.act", (n_up + 1) * 2.0 * m_e * local * f_e),
                    Gemm("expert.down", m_e, h, f_e, local, grouped=True))
        return (Gemm("expert.down.dgrad", m_e, f_e, h, local, grouped=True),
                Gemm("expert.down.wgrad", f_e, h, m_e, local, grouped=True),
                MemoryBound("expert.act.bwd", (2 * n_up + 1) * 2.0 * m_e * local * f_e),
                Gemm("expert.up.dgrad", m_e, h, n_up * f_e, local, grouped=True),
                Gemm("expert.up.wgrad", h, n_up * f_e, m_e, local, grouped=True))

    def _sorted_experts(self, c: MoE, backward: bool) -> tuple[KernelDesc, ...]:
        """The local experts between Megatron's second permutation and its inverse: with several local
        experts, the all-to-all dispatcher sorts the received tokens by local expert and unsorts the
        experts' output before the combine (``sort_chunks_by_idxs``, fused by TE under
        ``moe_permute_fusion``: one read and one write of the k x tokens copies; megatron/core/transformer/
        moe/token_dispatcher.py ``dispatch_postprocess`` / ``combine_preprocess``). DeepEP dispatches
        straight to its permuted layout, which the permute before dispatch already stands for."""
        experts = self._experts(c, backward)
        _, _, local, m_e, _, _ = self._moe_dims(c)
        if self.ep == 1 or local == 1 or self.ep_dedup:
            return experts
        copies = float(m_e * local * c.hidden)
        # forward: sort the dispatched tokens (the dispatch's precision), unsort the BF16 outputs;
        # backward: the gradients of both, BF16
        first = 2.0 if backward else self.dispatch_bytes_per_elem
        sort = MemoryBound("expert.sort_chunks" + (".bwd" if backward else ""), 2 * first * copies)
        unsort = MemoryBound("expert.unsort_chunks" + (".bwd" if backward else ""), 2 * 2.0 * copies)
        return (unsort, *experts, sort) if backward else (sort, *experts, unsort)

    def _shared(self, c: MoE, backward: bool) -> tuple[KernelDesc, ...]:
        h, n_up = c.hidden, c.n_up
        tokens, _, _, _, _, f_s = self._moe_dims(c)
        if not f_s:
            return ()
        if not backward:
            return (Gemm("shared.up", tokens, n_up * f_s, h),
                    MemoryBound("shared.act", (n_up + 1) * 2.0 * tokens * f_s), Gemm("shared.down", tokens, h, f_s))
        return (Gemm("shared.down.dgrad", tokens, f_s, h), Gemm("shared.down.wgrad", f_s, h, tokens),
                MemoryBound("shared.act.bwd", (2 * n_up + 1) * 2.0 * tokens * f_s),
                Gemm("shared.up.dgrad", tokens, h, n_up * f_s), Gemm("shared.up.wgrad", h, n_up * f_s, tokens))

    def _moe_comms(self, c: MoE) -> tuple[Comm, Comm, float]:
        """Dispatch and combine all-to-alls over the EP group (nccl-tests size: this rank's send buffer,
        tokens x top_k copies of h, times the busiest rank's load), and the expert-TP gather size."""
        tokens, k, _, _, _, _ = self._moe_dims(c)
        copies = float(tokens * k * c.hidden) * self.expert_load
        moe = self.model.moe
        assert moe is not None
        # DeepEP-style dispatch: a token crosses the network once per node it is routed to (at most
        # topk_group nodes under group-limited routing) and fans out over NVLink (collectives.py
        # "node_limited" a2a)
        limit = moe.topk_group if moe.group_limited else 0
        coll = (Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(limit, k, c.n_experts)) if self.ep_dedup
                else ALL_TO_ALL)
        return (Comm(coll, copies * self.dispatch_bytes_per_elem, "ep"),
                Comm(coll, copies * 2.0, "ep"), copies * 2.0 * self.etp)

    def moe_forward(self, c: MoE) -> list[Segment]:
        """Router, permute, dispatch, local experts, combine, unpermute, shared experts.

        Megatron-core MoELayer with the all-to-all token dispatcher (``token_dispatcher.py``); with
        expert TP the dispatched tokens are all-gathered over the etp group and reduce-scattered after.
        With ``ep_overlap`` the shared experts run while the dispatch is in flight (Megatron
        ``--moe-shared-expert-overlap``; DeepSeek-V3 sec. 3.2.2 overlaps all-to-alls with computation).
        """
        h = c.hidden
        tokens, k, _, _, _, _ = self._moe_dims(c)
        router = (Gemm("router", tokens, c.n_experts, h),
                  MemoryBound("router.topk", 3 * 4.0 * tokens * c.n_experts),
                  MemoryBound("moe.permute", 2 * 2.0 * tokens * k * h))
        dispatch, combine, gathered = self._moe_comms(c)
        experts: list[Segment] = [self._sorted_experts(c, False)]
        if self.etp > 1:
            experts = [Comm(ALL_GATHER, gathered, "etp"), *experts, Comm(REDUCE_SCATTER, gathered, "etp")]
        unpermute = (MemoryBound("moe.unpermute", (k + 1) * 2.0 * tokens * h),)
        shared = self._shared(c, False)
        if self.ep_overlap:
            return [router, dispatch.overlapped(), shared, *experts, combine, unpermute]
        return [router, dispatch, *experts, combine, (*unpermute, *shared)]

    def moe_backward(self, c: MoE) -> list[Segment]:
        """Mirror of the forward: combine's backward is a dispatch-sized all-to-all and vice versa."""
        h = c.hidden
        tokens, k, _, _, _, _ = self._moe_dims(c)
        dispatch, combine, gathered = self._moe_comms(c)
        unpermute = (MemoryBound("moe.unpermute.bwd", (k + 1) * 2.0 * tokens * h),)
        experts: list[Segment] = [self._sorted_experts(c, True)]
        if self.etp > 1:
            experts = [Comm(ALL_GATHER, gathered, "etp"), *experts, Comm(REDUCE_SCATTER, gathered, "etp")]
        router = (MemoryBound("moe.permute.bwd", 2 * 2.0 * tokens * k * h),
                  MemoryBound("router.topk.bwd", 3 * 4.0 * tokens * c.n_experts),
                  Gemm("router.dgrad", tokens, h, c.n_experts), Gemm("router.wgrad", h, c.n_experts, tokens))
        grad_combine = Comm(combine.coll, combine.size_bytes, "ep")
        grad_dispatch = Comm(combine.coll, combine.size_bytes, "ep")  # gradients travel in BF16
        shared = self._shared(c, True)
        if self.ep_overlap:
            return [unpermute, grad_combine.overlapped(), shared, *experts, grad_dispatch, router]
        return [(*unpermute, *shared), grad_combine, *experts, grad_dispatch, router]
