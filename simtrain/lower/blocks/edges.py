"""Kernels outside the transformer layers on one TP rank: the token (+ position) embedding, the final norm,
LM head and cross-entropy (vocab-parallel across TP, Megatron-LM), and the MTP module's projection.
"""

from __future__ import annotations

from simtrain.lower.blocks.segments import Comm, Segment
from simtrain.lower.blocks.shape import BlockShape
from simtrain.lower.kernels import KernelDesc, MemoryBound
from simtrain.spec.collective_kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER


class EdgeKernels(BlockShape):
    """Embedding, head and MTP-projection kernels (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    def mtp_projection(self, backward: bool) -> tuple[KernelDesc, ...]:
        """The MTP module's projection of the concatenated [norm(h), norm(embedding)] (2h -> h, per TP
        rank; DeepSeek-V3 sec. 2.2 eq. 21), with its two norms."""
        h = self.model.hidden
        norms = (self._norm("mtp.norms", backward),) * 2
        if backward:
            return (*self._gemm_bwd("mtp.proj", h // self.t, 2 * h), *norms)
        return (self._gemm_fwd("mtp.proj", h // self.t, 2 * h), *norms)

    def _embedding_forward(self) -> list[Segment]:
        """Token (+ learned position) embedding; vocab-parallel embeddings reduce across TP."""
        h = self.model.hidden
        kernels = [MemoryBound("embedding", 2 * 2.0 * self.T * h)]
        if self.model.position == "learned":
            kernels.append(MemoryBound("pos_embedding", 3 * 2.0 * self.T * h))
        if self.t == 1:
            return [tuple(kernels)]
        return [tuple(kernels), Comm(REDUCE_SCATTER if self.sp else ALL_REDUCE, 2.0 * self.T * h)]

    def _embedding_backward(self) -> list[Segment]:
        """Embedding gradient (scatter-add of the token gradients)."""
        k = (MemoryBound("embedding.bwd", 3 * 2.0 * self.T * self.model.hidden),)
        if self.t > 1 and self.sp:
            return [Comm(ALL_GATHER, 2.0 * self.T * self.model.hidden), k]
        return [k]

    def _head_forward(self) -> list[Segment]:
        """Final norm, LM head GEMM and cross-entropy (vocab-parallel across TP)."""
        h, v = self.model.hidden, self.model.vocab // self.t
        ln = self._norm("final_norm", False)
        # the loss as one fused kernel (read the bf16 logits, write and re-read an fp32 softmax: 10 bytes per
        # logit); a stack scales it by the passes its framework makes (``SoftwareStack.fusion.loss``:
        # Megatron-core's jit-fused path 2.5x, its unfused one 3.25x; derived in ``simtrain.spec.stack_spec``)
        head = (self._gemm_fwd("lm_head", v, h),
                MemoryBound("cross_entropy", self.T * v * (2.0 + 4.0 + 4.0)))
        if self.t == 1:
            return [(ln, *head)]
        pre: list[Segment] = [(ln,), Comm(ALL_GATHER, 2.0 * self.T * h)] if self.sp else [(ln,)]
        # vocab-parallel cross-entropy all-reduces the max and the sum of exp per token (fp32)
        return [*pre, head, Comm(ALL_REDUCE, 2 * 4.0 * self.T)]

    def _head_backward(self) -> list[Segment]:
        """Cross-entropy and LM-head backward, then the final norm's."""
        h, v = self.model.hidden, self.model.vocab // self.t
        ce = MemoryBound("cross_entropy.bwd", self.T * v * (4.0 + 2.0))
        head = (ce, *self._gemm_bwd("lm_head", v, h))
        ln = self._norm("final_norm.bwd", True)
        if self.t == 1:
            return [(*head, ln)]
        return [head, Comm(REDUCE_SCATTER if self.sp else ALL_REDUCE, 2.0 * self.T * h), (ln,)]
