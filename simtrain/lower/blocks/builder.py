"""``BlockBuilder``: the segments of one layer, the embedding and the LM head for one micro-batch on one TP
rank, as lowering and the search estimate run them (``simtrain.lower.layer_plan.build_block`` makes one).

It is ``BlockShape`` with every component's kernels mixed in (``layer``, ``attention``, ``mlp``, ``moe``,
``generic``, ``recompute``, ``edges``); the public builders here add what the software stack does around the
collectives: DTensor's layout copies and the GEMMs TP comm overlap splits into chunks.
"""

from __future__ import annotations

from simtrain.lower.blocks.edges import EdgeKernels
from simtrain.lower.blocks.layer import LayerKernels
from simtrain.lower.blocks.recompute import RecomputeKernels
from simtrain.lower.blocks.segments import TP_OVERLAP_CHUNKS, Comm, Segment, leading_gemms, merge
from simtrain.lower.kernels import KernelDesc, MemoryBound, row_chunked
from simtrain.spec.collective_kinds import CollectiveKind


class BlockBuilder(LayerKernels, RecomputeKernels, EdgeKernels):
    """Builds the segments of one layer/embedding/head for one micro-batch on one TP rank."""

    __slots__ = ()

    # -- public segment builders: the private ones plus the layout copies of sequence-parallel collectives

    def layer_forward(self, layer: int | None = None) -> list[Segment]:
        """Forward segments of transformer layer ``layer`` (None: the model's common dense layer)."""
        return self._finished(self._layer_forward(layer))

    def layer_backward(self, layer: int | None = None) -> list[Segment]:
        """Backward segments of transformer layer ``layer``."""
        return self._finished(self._layer_backward(layer))

    def op_sac_recompute(self, layer: int | None) -> list[Segment]:
        """Segments op-level SAC re-runs before a layer's backward (see ``_op_sac_recompute``)."""
        return self._finished(self._op_sac_recompute(layer))

    def embedding_forward(self) -> list[Segment]:
        """Token (+ learned position) embedding."""
        return self._finished(self._embedding_forward())

    def embedding_backward(self) -> list[Segment]:
        """Embedding gradient."""
        return self._finished(self._embedding_backward())

    def head_forward(self) -> list[Segment]:
        """Final norm, LM head GEMM and cross-entropy."""
        return self._finished(self._head_forward())

    def head_backward(self) -> list[Segment]:
        """Cross-entropy, LM-head and final-norm backward."""
        return self._finished(self._head_backward())

    def _finished(self, segs: list[Segment]) -> list[Segment]:
        """``segs`` as the engine runs them: DTensor's layout copies (``_with_layout_copies``), then the
        GEMMs TP comm overlap splits by rows marked as run in chunks (``_row_chunked``)."""
        return self._row_chunked(self._with_layout_copies(segs))

    def _row_chunked(self, segs: list[Segment]) -> list[Segment]:
        """With TP comm overlap, the GEMMs a fused collective splits by rows into ``TP_OVERLAP_CHUNKS``
        (the leading GEMMs fed by an all-gather, the trailing GEMMs that feed a reduce-scatter or
        all-reduce, weight-gradient GEMMs excepted: they contract over the split dim and run whole, as
        Transformer Engine's bulk overlaps run them), each marked ``Gemm.row_chunks`` (the cost pass costs it
        as that many GEMMs of m / chunks rows, ``ComputeCostModel.row_chunked``): TE userbuffers and torch's fused_all_gather_matmul /
        fused_matmul_reduce_scatter launch one GEMM per chunk. Mirrors ``lowering._Emitter._overlapped``."""
        if not (self.tp_overlap and self.t > 1):
            return segs
        out = list(segs)
        for i, seg in enumerate(out):
            if not (isinstance(seg, tuple) and seg):
                continue
            prev, nxt = out[i - 1] if i else None, out[i + 1] if i + 1 < len(out) else None
            kernels = [k for k in seg if k is not None]
            lead = trail = 0
            if (isinstance(prev, Comm) and prev.fused_with_gemm(self.tp_overlap)
                    and prev.coll.kind is CollectiveKind.ALL_GATHER):
                lead = leading_gemms(tuple(kernels), gathered=True)
            if (isinstance(nxt, Comm) and nxt.fused_with_gemm(self.tp_overlap)
                    and nxt.coll.kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE)):
                trail = leading_gemms(tuple(kernels[::-1]), gathered=True)
            split = set(range(lead)) | set(range(len(kernels) - trail, len(kernels)))
            out[i] = tuple(row_chunked(k, TP_OVERLAP_CHUNKS) if j in split else k
                           for j, k in enumerate(kernels))
        return out

    def _with_layout_copies(self, segs: list[Segment]) -> list[Segment]:
        """``segs`` with the memory passes around each sequence-parallel TP collective that DTensor TP
        (``dtensor_tp``) adds beyond the collective itself:

        - run through torch's functional collectives (unfused): a copy of the full tensor after each
          all-gather and before each reduce-scatter (read and write; see ``dtensor_tp``);
        - fused with its matmul by async TP (torch/distributed/_symmetric_memory/__init__.py): before a
          ``fused_all_gather_matmul`` each rank copies its shard into the symmetric-memory workspace and
          waits at a barrier before the first matmul chunk (``_pipelined_multi_all_gather_and_consume``:
          "we are giving up the chance to overlap 'mv' and 'b' with the first shard_consumer"), read and
          write of the shard; after a ``fused_matmul_reduce_scatter`` the tp partial outputs stacked by
          ``_pipelined_produce_and_all2all`` are summed by a separate reduction (``reduce_fn(
          stacked_partials...)``), which reads all tp partials (the unreduced output, ``size_bytes``)
          and writes one shard, once every chunk has arrived. NCCL's reduce-scatter reduces in flight,
          inside the collective's own time.
        """
        if not (self.dtensor_tp and self.sp and self.t > 1):
            return segs
        out: list[Segment | tuple[KernelDesc | None, ...]] = []
        for seg in segs:
            if not (isinstance(seg, Comm) and seg.axis == "tp"
                    and seg.coll.kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER)):
                out.append(seg)
            elif seg.fused_with_gemm(self.tp_overlap) and seg.coll.kind is CollectiveKind.ALL_GATHER:
                out += [(MemoryBound("tp.ag_shard_copy", 2.0 * seg.size_bytes / self.t),), seg]
            elif seg.fused_with_gemm(self.tp_overlap):
                out += [seg, (MemoryBound("tp.rs_reduce", seg.size_bytes * (1.0 + 1.0 / self.t)),)]
            elif seg.coll.kind is CollectiveKind.ALL_GATHER:
                out += [seg, (MemoryBound("tp.gather_copy", 2.0 * seg.size_bytes),)]
            else:
                out += [(MemoryBound("tp.scatter_copy", 2.0 * seg.size_bytes),), seg]
        return merge(out)
