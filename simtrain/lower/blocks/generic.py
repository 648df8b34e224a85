"""Kernels of any layer component from its description alone (``simtrain.spec.layer_desc.Component``), for
a block type no kernel builder is registered for (``simtrain.lower.blocks.layer.register_kernels``).

The component's linears run as GEMMs on this rank (``Linear.per_rank``): the column-parallel and replicated
ones first, reading the layer input (all-gathered under sequence parallelism), the row-parallel ones last,
their partial sums reduced after the component, as Megatron-LM splits a transformer sublayer (Shoeybi et al.
2019, sec. 3). Between them one memory-bound kernel stands for the rest of the component (a scan, a gate, a
convolution): it reads what the first linears wrote and writes what the last ones read, BF16, and twice
that in backward (it reads the saved input and the incoming gradient and writes a gradient of each).
Its FLOPs count in the model FLOPs (``Component.seq_flops_per_token``), not in the kernel's time: an
elementwise mixer is bound by memory. A component that needs more (a FlashAttention-like core) registers
its own kernels.
"""

from __future__ import annotations

from simtrain.lower.blocks.segments import Segment
from simtrain.lower.blocks.shape import BlockShape, column_parallel
from simtrain.lower.kernels import KernelDesc, MemoryBound
from simtrain.spec.layer_desc import Component, Linear


class GenericKernels(BlockShape):
    """Kernels of a described component with no registered kernel builder (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    def _split(self, c: Component) -> tuple[tuple[Linear, ...], tuple[Linear, ...]]:
        """(linears reading the layer input, row-parallel linears writing the output), forward order."""
        lins = c.linears()
        return tuple(lin for lin in lins if column_parallel(lin)), tuple(lin for lin in lins if not column_parallel(lin))

    def _mixer_core(self, c: Component, backward: bool) -> KernelDesc:
        ins, outs = self._split(c)
        elems = sum(lin.per_rank(self.t)[1] for lin in ins) + sum(lin.per_rank(self.t)[0] for lin in outs)
        name = type(c).__name__.lower() + (".core.bwd" if backward else ".core")
        return MemoryBound(name, (2.0 if backward else 1.0) * 2.0 * self.T * elems)

    def component_forward(self, c: Component) -> list[Segment]:
        """The input linears, the core, the output linears: one compute segment."""
        ins, outs = self._split(c)
        h = self.model.hidden
        return [(*(self._linear_fwd(lin, gathered=lin.d_in == h) for lin in ins), self._mixer_core(c, False),
                 *(self._linear_fwd(lin) for lin in outs))]

    def component_backward(self, c: Component) -> list[Segment]:
        """The forward's mirror: output linears' dgrad and wgrad, the core's backward, the input linears'."""
        ins, outs = self._split(c)
        return [(*(k for lin in reversed(outs) for k in self._linear_bwd(lin)), self._mixer_core(c, True),
                 *(k for lin in reversed(ins) for k in self._linear_bwd(lin)))]

    def component_column_start(self, c: Component) -> int:
        """Index of the input linears' first backward GEMM in ``component_backward``'s segment."""
        return 2 * len(self._split(c)[1]) + 1
