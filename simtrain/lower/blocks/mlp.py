"""Kernels of a dense MLP on one TP rank, read from the layer description (``simtrain.spec.layer_desc.MLP``):
the up projection (gate and up fused under SwiGLU: (T, n_up*f/t, h)), the activation, the down projection
(T, h, f/t); backward mirrors them (dgrad and wgrad per GEMM).
"""

from __future__ import annotations

from simtrain.lower.blocks.segments import Segment
from simtrain.lower.blocks.shape import BlockShape
from simtrain.lower.kernels import MemoryBound
from simtrain.spec.layer_desc import MLP


class MLPKernels(BlockShape):
    """The dense-MLP kernels of ``BlockShape``'s micro-batch (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    def mlp_forward(self, c: MLP) -> list[Segment]:
        """Up projection, activation, down projection: one compute segment."""
        h, f, n_up = c.hidden, c.ffn // self.t, c.n_up
        act = MemoryBound("act", (n_up + 1) * 2.0 * self.T * f)
        return [(self._gemm_fwd("mlp_up", n_up * f, h, gathered=True), act, self._gemm_fwd("mlp_down", h, f))]

    def mlp_backward(self, c: MLP) -> list[Segment]:
        """Down projection's backward, the activation's, the up projection's (from index ``MLP_COLUMN_START``)."""
        h, f, n_up = c.hidden, c.ffn // self.t, c.n_up
        act = MemoryBound("act.bwd", (2 * n_up + 1) * 2.0 * self.T * f)
        return [(*self._gemm_bwd("mlp_down", h, f), act, *self._gemm_bwd("mlp_up", n_up * f, h))]


MLP_COLUMN_START = 3
"""Index of the up projection's first backward GEMM in ``mlp_backward``'s segment (after the down
projection's dgrad and wgrad and the activation's backward)."""
