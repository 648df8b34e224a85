"""Kernels of one transformer layer, the embedding and the LM head, per TP rank, by layer component.

- ``segments``: what builders return (kernel tuples, ``Comm``, ``Ring``) and ``merge``;
- ``shape``: ``BlockShape``, one micro-batch on one rank, and the kernels all parts share (GEMMs, norms);
- one module per kind of component of the layer description (``simtrain.spec.layer_desc``): ``attention``,
  ``mlp``, ``moe``, and ``generic`` for any other described component;
- ``layer``: a layer walked from its description, with the TP collectives; the registry of kernels by
  component type; ``recompute``: what recompute re-runs; ``edges``: embedding, head, MTP projection;
- ``builder``: ``BlockBuilder``, all of them together, with the stack's layout copies and GEMM chunks.
"""

from simtrain.lower.blocks.builder import BlockBuilder
from simtrain.lower.blocks.layer import KERNELS, ComponentKernels, kernels_of, register_kernels
from simtrain.lower.blocks.segments import TP_OVERLAP_CHUNKS, Comm, Ring, Segment, leading_gemms, merge
from simtrain.lower.blocks.shape import AMAX_BYTES, AMAX_CASTS_TE, AMAX_CASTS_TORCHAO, BlockShape

__all__ = [
    "AMAX_BYTES", "AMAX_CASTS_TE", "AMAX_CASTS_TORCHAO", "KERNELS", "TP_OVERLAP_CHUNKS", "BlockBuilder", "BlockShape",
    "Comm", "ComponentKernels", "Ring", "Segment", "kernels_of", "leading_gemms", "merge", "register_kernels",
]  # fmt: skip
