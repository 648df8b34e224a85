"""The shape of one micro-batch on one TP rank, and the kernels every part of a layer shares.

``BlockShape`` holds what the kernels of a layer depend on besides the model: tokens (b, s), the parallel
degrees (t, cp, ep, etp), sequence parallelism and the software stack's switches. The component kernels
(``attention``, ``mlp``, ``moe``, ``generic``), the layer's assembly (``layer``) and the builder (``builder``)
extend it; they read the model's layer description (``simtrain.spec.layer_desc``) for the shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from simtrain.lower.blocks.segments import Comm, Segment
from simtrain.lower.kernels import Gemm, KernelDesc, MemoryBound
from simtrain.spec.collective_kinds import ALL_REDUCE
from simtrain.spec.layer_desc import Linear, TPStyle
from simtrain.spec.model import ModelSpec

#: Tensorwise FP8 on DTensor TP (torchao Float8Linear with Float8ColwiseParallel / Float8RowwiseParallel /
#: PrepareFloat8ModuleInput, torchtitan): each cast of a TP-sharded tensor takes ``torch.max(torch.abs(x))``
#: of a sharded DTensor, a Partial("max") result that the scale's ``clamp`` redistributes to Replicate, one
#: all-reduce of a 4-byte fp32 amax on the TP group before the cast can run (torchao float8_utils
#: ``tensor_to_amax`` / ``amax_to_scale``). Per layer: forward, the attention and MLP module inputs (cast
#: before their all-gathers), the seven weights (wq, wk, wv, wo, w1, w2, w3) and the two row-parallel inputs
#: (wo, w2): 6 around attention, 5 around the MLP; backward, the grad output of every linear, cast where
#: ``_prepare_output_fn`` wrapped the output (``NoopFwToFloat8BwDynamic``: Shard(-1) for the column-parallel
#: ones, Shard(1) after the row-parallel reduce-scatter): 4 and 3.
AMAX_CASTS_TORCHAO: Mapping[str, int] = MappingProxyType({"attn_fwd": 6, "mlp_fwd": 5, "attn_bwd": 4, "mlp_bwd": 3})
#: Transformer Engine's per-tensor current scaling under sequence parallelism reduces over the TP group only
#: the amax of tensors it all-gathers in FP8: each column-parallel input (QKV, FC1) in forward and each
#: row-parallel grad output (proj, FC2) in backward (``Linear`` / ``LayerNormLinear`` / ``LayerNormMLP``
#: ``_customize_quantizers_float8_current_scaling``: ``with_amax_reduction = True``, ``amax_reduction_group =
#: tp_group``); weights are local shards with local scales.
AMAX_CASTS_TE: Mapping[str, int] = MappingProxyType({"attn_fwd": 1, "mlp_fwd": 1, "attn_bwd": 1, "mlp_bwd": 1})
AMAX_BYTES = 4.0


@dataclass(frozen=True, slots=True)
class BlockShape:
    """One micro-batch on one TP rank: the model, tokens, parallel degrees and stack switches (every
    builder of ``simtrain.lower.blocks`` is one of these)."""

    model: ModelSpec
    b: int
    s: int
    t: int
    sp: bool
    flash: bool
    dropout: bool
    cp: int = 1
    cp_comm: str = "p2p"
    ep: int = 1
    etp: int = 1
    ep_overlap: bool = False
    dispatch_bytes_per_elem: float = 2.0
    """Bytes per element of the dispatched tokens (DeepSeek-V3 dispatches in FP8: 1; BF16: 2)."""
    ep_dedup: bool = False
    """Dispatch crosses the network once per remote node a token is routed to (DeepEP/HybridEP,
    ``layout.ep_dispatcher``), not once per expert copy."""
    probs_all_to_all: bool = False
    """The all-to-all dispatcher sends the routing probabilities in a second EP all-to-all (stack
    ``moe.probs_all_to_all``: Megatron-core 0.13 and later)."""
    fp8_expert_padding: bool = False
    """FP8 grouped GEMMs need every expert's rows a multiple of 16 (32 for MXFP8): Transformer Engine's
    ``Fp8Padding`` / ``Fp8Unpadding`` copy the experts' input and output into padded buffers (and back in
    backward) unless every split is already aligned (Megatron-core ``TEGroupedMLP.forward`` under
    ``config.fp8``; te.pytorch.module.fp8_padding: ``if m_splits == padded_m_splits: return inp``), which
    uneven routing never is. Megatron's ``--moe-router-padding-for-fp8`` pads the routing map instead
    (no copies); it is off by default."""
    expert_load: float = 1.0
    """Routed token copies the busiest EP rank receives, as a multiple of balanced routing
    (``simtrain.plan.routing.worst_rank_load``): every all-to-all lasts until its link has moved them."""
    amax_casts: Mapping[str, int] = field(default_factory=dict)
    """FP8 casts per layer whose amax is all-reduced over the TP group before they run, by place
    (``attn_fwd``, ``mlp_fwd``, ``attn_bwd``, ``mlp_bwd``): ``AMAX_CASTS_TORCHAO`` (tensorwise FP8 on
    DTensor TP), ``AMAX_CASTS_TE`` (Transformer Engine current scaling under SP), or none."""
    fp8_tp_gather: bool = False
    """The column-parallel layers' input is cast to FP8 on its sequence shard before the TP all-gather,
    which then moves 1 byte per element: torchao ``Float8ColwiseParallel`` / ``PrepareFloat8ModuleInput``
    (torchtitan docs/float8.md: "float8 all-gather ... for TP (by default for Float8Linear)"), tensorwise
    scaling. Forward and replayed-forward gathers only; backward gathers stay BF16."""
    torch_cp: bool = False
    """Ring attention as torch's ``context_parallel`` runs it (torch/distributed/tensor/experimental/
    _attention.py, default ``_ContextParallelOptions``: ``rotate_method=ALL_GATHER``, ``convert_to_f32``):
    K and V, expanded to the query heads (torchtitan repeats the KV heads before SDPA), are all-gathered
    once, beside the first block, in forward and again in backward; every step concatenates the K and V
    it holds (``torch.cat([key.flatten(), value.flatten()])``), and in backward the fp32 dK and dV
    accumulators travel the ring (``_AllToAllRotater``), concatenated each step too."""
    dtensor_tp: bool = False
    """Tensor parallelism through DTensor (torchtitan), with two consequences:

    - Each sequence-parallel all-gather run by torch's functional collectives is followed, and each
      reduce-scatter preceded, by a copy of the full tensor: they gather and scatter along dim 0, so
      DTensor's Shard(1) ([batch, seq, hidden] sequence sharding) costs ``torch.cat(torch.chunk(out, n,
      0), dim=1)`` after an all-gather and ``torch.cat(torch.chunk(x, n, dim=1))`` before a
      reduce-scatter (torch/distributed/_functional_collectives.py, ``all_gather_tensor`` /
      ``reduce_scatter_tensor``). Async TP's fused ops read and write the shards in place, but copy
      the shard in before a fused all-gather and sum the stacked partials after a fused
      reduce-scatter (``_with_layout_copies``).
    - The query/key/value and gate/up projections are separate linears (torchtitan ``Attention.wq/wk/wv``,
      ``FeedForward.w1/w3``), so in backward the input gradient reduce-scattered is a sum of several
      GEMM outputs: async TP's pattern matcher fuses a reduce-scatter only with the one matmul that
      produces it (torch/_inductor/fx_passes/micro_pipeline_tp.py), so these two run unfused."""
    tp_overlap: bool = False
    """TP comm overlap (async TP) is on: fusable collectives run in the fused ops, without layout copies."""
    tp_async_grad_allreduce: bool = False
    """Without sequence parallelism the column-parallel layers all-reduce their input gradient beside
    their wgrad GEMM (Megatron, ``_column_backward``); False: after their backward, blocking (autograd
    runs the all-reduce of ``copy_to_tensor_model_parallel_region`` or DTensor's redistribute after the
    linear's backward has produced both gradients)."""

    @property
    def T(self) -> int:  # noqa: N802 - the paper's symbol for tokens
        """Tokens of one micro-batch (b * s)."""
        return self.b * self.s

    @property
    def Tn(self) -> int:  # noqa: N802
        """Tokens each rank's norms/residuals see (T/t with sequence parallelism)."""
        return self.T // self.t if self.sp else self.T

    def _gemm_fwd(self, name: str, n: int, k: int, gathered: bool = False) -> KernelDesc:
        """Forward GEMM; ``gathered``: its input is the TP all-gather's output (column-parallel)."""
        share = 1.0 / self.t if gathered and self.fp8_tp_gather else 1.0
        return Gemm(name, self.T, n, k, a_cast_share=share)

    def _gather_bytes(self, size: float) -> float:
        """Bytes of a forward all-gather feeding column-parallel GEMMs of ``size`` BF16 bytes."""
        return size / 2.0 if self.fp8_tp_gather else size

    def _amax(self, where: str) -> list[Segment]:
        """The all-reduces of one fp32 amax over the TP group that the FP8 casts at ``where`` (an
        ``amax_casts`` key) run; none without TP."""
        if self.t == 1:
            return []
        return [Comm(ALL_REDUCE, AMAX_BYTES, fusable=False) for _ in range(self.amax_casts.get(where, 0))]

    def _gemm_bwd(self, name: str, n: int, k: int) -> tuple[KernelDesc, KernelDesc]:
        return (Gemm(name + ".dgrad", self.T, k, n), Gemm(name + ".wgrad", k, n, self.T))

    def _norm(self, name: str, backward: bool) -> KernelDesc:
        n = 3 if backward else 2  # fwd: read x, write y; bwd: read x and dy, write dx
        return MemoryBound(name, n * 2.0 * self.Tn * self.model.hidden)

    def _residual(self, name: str, backward: bool) -> KernelDesc | None:
        h = self.model.hidden
        if backward:
            return MemoryBound(name, 2 * 2.0 * self.Tn * h + self.Tn * h) if self.dropout else None
        mask = self.Tn * h if self.dropout else 0.0
        return MemoryBound(name, 3 * 2.0 * self.Tn * h + mask)

    def _linear_fwd(self, lin: Linear, gathered: bool = False) -> KernelDesc:
        """The forward GEMM of one linear of the layer description on this rank (``Linear.per_rank``)."""
        d_in, d_out = lin.per_rank(self.t)
        return self._gemm_fwd(lin.name, d_out, d_in, gathered=gathered)

    def _linear_bwd(self, lin: Linear) -> tuple[KernelDesc, KernelDesc]:
        """The dgrad and wgrad GEMMs of one linear of the layer description on this rank."""
        d_in, d_out = lin.per_rank(self.t)
        return self._gemm_bwd(lin.name, d_out, d_in)


def column_parallel(lin: Linear) -> bool:
    """Whether a linear reads the layer input's TP all-gather (column-parallel or replicated)."""
    return lin.tp != TPStyle.ROW
