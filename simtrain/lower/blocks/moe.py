"""Kernels of a mixture-of-experts MLP on one rank, read from the layer description
(``simtrain.spec.layer_desc.MoE``: experts, top-k, widths, shared experts): router (gating GEMM and the
fused router's top-k and load-balancing kernels), permutation (its index maps and the copy), dispatch and
combine all-to-alls over the EP group, the sort by local expert, Transformer Engine's FP8 row-alignment
copies, the local experts as grouped GEMMs (their per-expert tiles: ``simtrain.cost.grouped``), the shared
experts.
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

#: Bytes per element of the router's scores and probabilities: fp32 (Megatron-core computes the
#: top-k and the aux loss in fp32, ``torch.softmax(..., dtype=torch.float32)``; TE's fused router too) [src].
ROUTER_BYTES = 4.0
#: Bytes per entry of the permutation's row maps (int32 row indices) [src].
SORT_MAP_BYTES = 4.0
#: Bytes per tokens-per-expert count the all-to-all dispatcher gathers over the EP group: int64
#: (``routing_map.sum(dim=0).long()``, megatron/core/transformer/moe/token_dispatcher.py ``preprocess``) [src].
COUNT_BYTES = 8.0


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

    def _padded_experts(self, c: MoE, backward: bool) -> tuple[KernelDesc, ...]:
        """The local experts' grouped GEMMs, between Transformer Engine's FP8 row-alignment copies when
        ``fp8_expert_padding``: forward, the input into the padded buffer (the dispatch's precision) and
        the BF16 output out of it (``Fp8Padding`` / ``Fp8Unpadding``: ``fused_multi_row_padding`` /
        ``fused_multi_row_unpadding``, one read and one write of every routed copy); backward, their
        mirror images on the BF16 gradients."""
        experts = self._experts(c, backward)
        if not self.fp8_expert_padding:
            return experts
        _, _, local, m_e, _, _ = self._moe_dims(c)
        copies = float(m_e * local * c.hidden)
        first = 2.0 if backward else self.dispatch_bytes_per_elem
        pad = MemoryBound("expert.fp8_pad" + (".bwd" if backward else ""), 2 * first * copies)
        unpad = MemoryBound("expert.fp8_unpad" + (".bwd" if backward else ""), 2 * 2.0 * copies)
        return (unpad, *experts, pad) if backward else (pad, *experts, unpad)

    def _sorted_experts(self, c: MoE, backward: bool) -> tuple[KernelDesc, ...]:
        """The local experts between Megatron's second permutation and its inverse: with several local
        experts, the all-to-all dispatcher sorts the received tokens by local expert and unsorts the
        experts' output before the combine (``sort_chunks_by_idxs``, fused by TE under
        ``moe_permute_fusion``: one read and one write of the k x tokens copies; megatron/core/transformer/
        moe/token_dispatcher.py ``dispatch_postprocess`` / ``combine_preprocess``). DeepEP dispatches
        straight to its permuted layout, which the permute before dispatch already stands for."""
        experts = self._padded_experts(c, backward)
        _, _, local, m_e, _, _ = self._moe_dims(c)
        if self.ep == 1 or local == 1 or self.ep_dedup:
            return experts
        copies = float(m_e * local * c.hidden)
        # forward: sort the dispatched tokens (the dispatch's precision), unsort the BF16 outputs;
        # backward: the gradients of both, BF16
        first = 2.0 if backward else self.dispatch_bytes_per_elem
        sort = MemoryBound("expert.sort_chunks" + (".bwd" if backward else ""), 2 * first * copies)
        unsort = MemoryBound("expert.unsort_chunks" + (".bwd" if backward else ""), 2 * 2.0 * copies)
        if backward:  # the backward reuses the forward's maps (TE _moe_chunk_sort saves row_id_map)
            return (unsort, *experts, sort)
        # forward: each sort first builds its row map, one int32 per received copy (TE
        # ``make_chunk_sort_map``: _make_chunk_sort_map_kernel, then _sort_chunks_by_map_kernel)
        sort_map = MemoryBound("expert.sort_map", SORT_MAP_BYTES * m_e * local)
        return (sort_map, sort, *experts, sort_map, unsort)

    def _routing(self, c: MoE, backward: bool) -> tuple[KernelDesc, ...]:
        """The router's kernels after its gating GEMM, as Megatron-core's ``TopKRouter`` runs them with
        Transformer Engine's fused router (``--moe-router-fusion``, which NeMo's performance recipes set;
        megatron/core/transformer/moe/router.py ``routing`` / ``_apply_aux_loss``, moe_utils.py): top-k
        with the score function (``fused_topk_with_score_function``: read the fp32 logits, write probs
        and routing map), the load-balancing loss's own scores (``fused_compute_score_for_moe_aux_loss``),
        the tokens per expert (``routing_map.sum(dim=0)``) and the loss (``fused_moe_aux_loss``: a
        reduction of the scores over tokens). Backward: the loss's gradient broadcast to every (token,
        expert), the scores' and the top-k's backward, and the sum of the logits' two gradients. Each
        moves T x E fp32 elements (``ROUTER_BYTES``); at training sizes they are short kernels whose
        launch tails dominate."""
        te = float(self._moe_tokens * c.n_experts)
        if not backward:
            return (MemoryBound("router.topk", 3 * ROUTER_BYTES * te),
                    MemoryBound("router.aux_scores", 2 * ROUTER_BYTES * te),
                    MemoryBound("router.tokens_per_expert", te),
                    MemoryBound("router.aux_loss", ROUTER_BYTES * te))
        return (MemoryBound("router.aux_loss.bwd", ROUTER_BYTES * te),
                MemoryBound("router.aux_scores.bwd", 3 * ROUTER_BYTES * te),
                MemoryBound("router.topk.bwd", 3 * ROUTER_BYTES * te),
                MemoryBound("router.grad_sum", 3 * ROUTER_BYTES * te))

    def _permute_maps(self, c: MoE) -> tuple[KernelDesc, ...]:
        """The index kernels before the permutation (Megatron-core ``MoEAlltoAllTokenDispatcher``
        ``preprocess``: ``routing_map.sum(dim=0)``; ``--moe-permute-fusion``: Transformer Engine's
        ``moe_permute_with_probs`` builds its row map in three passes over the T x E routing map,
        transformer_engine/common/triton/permutation.py ``_row_id_map_pass_1/2/3_kernel``: block cumsum,
        global offsets, per-token compaction into int32 rows); the backward reuses the map."""
        te = float(self._moe_tokens * c.n_experts)
        return (MemoryBound("moe.tokens_per_expert", te),
                MemoryBound("moe.row_id_map", te + SORT_MAP_BYTES * te),
                MemoryBound("moe.row_id_map", 2 * SORT_MAP_BYTES * te),
                MemoryBound("moe.row_id_map", 2 * SORT_MAP_BYTES * te))

    @property
    def _all_to_all_dispatch(self) -> bool:
        """Tokens are dispatched by NCCL all-to-alls over an EP group (not by DeepEP's kernels, not without EP)."""
        return self.ep > 1 and not self.ep_dedup

    def _count_exchange(self, c: MoE) -> list[Segment]:
        """The exchange of the tokens-per-expert counts before an all-to-all dispatch: every EP rank needs
        the counts every other rank sends it to size its receive buffers (the all-to-all's output splits).
        Megatron-core's ``MoEAlltoAllTokenDispatcher.preprocess`` all-gathers its int64 counts over the
        expert (tensor x expert) group with ``gather_from_sequence_parallel_region``, a synchronous
        ``all_gather_into_tensor`` the next kernels wait for, before copying them to the host
        (megatron/core/transformer/moe/token_dispatcher.py); torchtitan's expert parallelism exchanges them
        with an ``all_to_all_single`` (torchtitan/distributed/expert_parallel.py ``_token_dispatch``). Once
        per MoE layer's forward (a recomputed forward repeats it); the backward reuses the splits. DeepEP's
        dispatch counts inside its own kernels (``get_dispatch_layout``, notify), so none there; nor without
        EP. Size: the nccl-tests all-gather size, experts x 8 bytes per rank."""
        if not self._all_to_all_dispatch:
            return []
        return [Comm(ALL_GATHER, COUNT_BYTES * c.n_experts * self.ep, "ep")]

    def _probs_exchange(self, c: MoE) -> list[Segment]:
        """The routing probabilities' own all-to-all, right after the tokens' (and its mirror in backward,
        before the tokens' gradient all-to-all): Megatron-core 0.13 and later weigh the experts' activation
        by them, so the all-to-all dispatcher sends each routed copy's fp32 probability along
        (``MoEAlltoAllTokenDispatcher.token_dispatch``: ``global_probs = all_to_all(self.ep_group,
        permuted_probs, self.output_splits, self.input_splits)``). Only under ``probs_all_to_all``, with EP,
        and not with DeepEP, whose dispatch kernel carries them. Size: one fp32 per routed copy, times the
        busiest rank's load as the tokens'."""
        if not (self.probs_all_to_all and self._all_to_all_dispatch):
            return []
        tokens, k, _, _, _, _ = self._moe_dims(c)
        return [Comm(ALL_TO_ALL, ROUTER_BYTES * tokens * k * self.expert_load, "ep")]

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
        counts, *row_maps = self._permute_maps(c)
        router = (Gemm("router", tokens, c.n_experts, h), *self._routing(c, False), counts)
        permute = (*row_maps, MemoryBound("moe.permute", 2 * 2.0 * tokens * k * h))
        exchange = self._count_exchange(c)
        # the counts, gathered before the permutation builds its row maps
        route: list[Segment] = [router, *exchange, permute] if exchange else [(*router, *permute)]
        dispatch, combine, gathered = self._moe_comms(c)
        experts: list[Segment] = [self._sorted_experts(c, False)]
        if self.etp > 1:
            experts = [Comm(ALL_GATHER, gathered, "etp"), *experts, Comm(REDUCE_SCATTER, gathered, "etp")]
        unpermute = (MemoryBound("moe.unpermute", (k + 1) * 2.0 * tokens * h),)
        shared = self._shared(c, False)
        probs = self._probs_exchange(c)
        if self.ep_overlap:
            return [*route, dispatch.overlapped(), shared, *probs, *experts, combine, unpermute]
        return [*route, dispatch, *probs, *experts, combine, (*unpermute, *shared)]

    def moe_backward(self, c: MoE) -> list[Segment]:
        """Mirror of the forward: combine's backward is a dispatch-sized all-to-all and vice versa."""
        h = c.hidden
        tokens, k, _, _, _, _ = self._moe_dims(c)
        dispatch, combine, gathered = self._moe_comms(c)
        unpermute = (MemoryBound("moe.unpermute.bwd", (k + 1) * 2.0 * tokens * h),)
        experts: list[Segment] = [self._sorted_experts(c, True)]
        if self.etp > 1:
            experts = [Comm(ALL_GATHER, gathered, "etp"), *experts, Comm(REDUCE_SCATTER, gathered, "etp")]
        router = (MemoryBound("moe.permute.bwd", 2 * 2.0 * tokens * k * h), *self._routing(c, True),
                  Gemm("router.dgrad", tokens, h, c.n_experts), Gemm("router.wgrad", h, c.n_experts, tokens))
        grad_combine = Comm(combine.coll, combine.size_bytes, "ep")
        grad_dispatch = Comm(combine.coll, combine.size_bytes, "ep")  # gradients travel in BF16
        shared = self._shared(c, True)
        probs = self._probs_exchange(c)  # the probabilities' gradient, sent back before the tokens'
        if self.ep_overlap:
            return [unpermute, grad_combine.overlapped(), shared, *experts, *probs, grad_dispatch, router]
        return [(*unpermute, *shared), grad_combine, *experts, *probs, grad_dispatch, router]
