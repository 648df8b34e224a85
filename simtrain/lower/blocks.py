"""Kernels of one transformer layer, the embedding and the LM head, per TP rank.

Each builder returns *segments*: a compute segment is a tuple of kernel descriptors
(``simtrain.lower.kernels``: shapes, FLOPs and bytes, no time; ``simtrain.cost.cost_pass`` costs them); a communication
segment is ``Comm(coll, axis, size_bytes)``. Segments alternate the way Megatron-LM's tensor
parallelism does (Shoeybi et al. 2019, Fig. 3: one all-reduce after the attention and one after the
MLP in forward, mirrored in backward; with sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2)
each all-reduce becomes a reduce-scatter, and an all-gather precedes each column-parallel GEMM).
Collective sizes use the nccl-tests convention (reference Table B): the full b*s*h*2 tensor.

GEMM shapes per rank (m tokens, column-parallel N / row-parallel K divided by t):
QKV (T, (q+2kv)/t, h), out-proj (T, h, q/t), MLP up (T, n_up*f/t, h), MLP down (T, h, f/t),
LM head (T, V/t, h). Backward runs dgrad (m, k, n) and wgrad (k, n, m) for each (Narayanan et al.
2021 appendix: backward = 2x forward FLOPs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Generic, TypeVar

from simtrain.lower.kernels import (
    FLASH_BLOCK,
    Attention,
    Gemm,
    KernelDesc,
    MemoryBound,
    NamedWork,
    row_chunked,
)
from simtrain.lower.memory import op_sac_recomputed
from simtrain.spec.collective_kinds import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    RING_SHIFT,
    Collective,
    CollectiveKind,
    NodeLimited,
)
from simtrain.spec.model import ModelSpec

TP_OVERLAP_CHUNKS = 4  # Megatron TP-comm overlap splits each GEMM/collective pair into chunks
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


def leading_gemms(kernels: Sequence[NamedWork], gathered: bool = False) -> int:
    """How many of ``kernels``, from the first, are GEMMs (FLOPs, not core attention or a memory-bound op).

    ``gathered``: count only the GEMMs an all-gather before them can feed chunk by chunk, those that read
    the gathered tensor as their row-split left operand: a weight-gradient GEMM (dW = X^T dY) contracts
    over the gathered token dim and waits for the whole gather. torch's micro-pipeline pass fuses an
    all-gather only with matmuls whose A is the gathered tensor (``torch/_inductor/fx_passes/
    micro_pipeline_tp.py``, ``fused_all_gather_matmul``); Transformer Engine's ``ub_overlap_ag`` splits
    the fprop / dgrad GEMM, and the wgrad GEMM runs after it on the gathered tensor.
    """
    n = 0
    for k in kernels:
        if not k.flops or k.name.startswith(("flash_attn", "attn.")) or (gathered and k.name.endswith(".wgrad")):
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class Comm:
    """A collective of the ``axis`` group between compute segments. The next compute segment waits for
    it, or, when ``overlap`` is set, the one after that (the next runs while it is in flight)."""

    coll: Collective
    size_bytes: float
    axis: str = "tp"
    overlap: bool = False
    fusable: bool = True
    """With TP comm overlap, whether it can be fused with the GEMM next to it (False: a reduce-scatter
    of a sum of several GEMMs' outputs, which torch's async TP pattern matcher does not fuse)."""

    def overlapped(self) -> Comm:
        """This collective, overlapped with the compute segment that follows it."""
        return replace(self, overlap=True)

    def fused_with_gemm(self, tp_overlap: bool) -> bool:
        """Whether TP comm overlap (``tp_overlap``) runs this collective fused with its GEMM, chunk by
        chunk: a fusable TP collective."""
        return tp_overlap and self.axis == "tp" and self.fusable


K = TypeVar("K", bound=NamedWork)
"""A kernel of a segment: a descriptor as lowering builds it, or a costed ``simtrain.lower.ops.Kernel``."""


@dataclass(frozen=True, slots=True)
class Ring(Generic[K]):
    """Ring attention (context parallelism, ``cp_comm=p2p``): ``steps`` attention blocks; while block
    i is computed, KV block i is passed on to the next CP rank (``comm``), and block i+1 waits for it
    (Liu et al. 2023 "Ring Attention"; Megatron-core ``AttnFuncWithCPAndKVP2P``). ``comm`` None: the
    blocks arrive otherwise (an all-gather before the ring) and the steps pass nothing on."""

    steps: int
    kernels: tuple[K, ...]
    comm: Comm | None


Segment = tuple[KernelDesc, ...] | Comm | Ring[KernelDesc]


def merge(segs: list[Segment | tuple[KernelDesc | None, ...]]) -> list[Segment]:
    """Concatenate adjacent kernel tuples (dropping None kernels and empty tuples) into one segment,
    except the segment right after an overlapped collective: it is what runs beside that collective,
    and the segment after it waits for the collective, so the two stay apart."""
    out: list[Segment] = []
    beside = False  # out[-1] is the segment an overlapped collective runs beside
    for seg in segs:
        if isinstance(seg, Comm | Ring):
            out.append(seg)
            beside = False
            continue
        kernels = tuple(k for k in seg if k is not None)
        if not kernels:
            continue
        if out and isinstance(out[-1], tuple) and not beside:
            out[-1] = out[-1] + kernels
        else:
            beside = bool(out) and isinstance(out[-1], Comm) and out[-1].overlap
            out.append(kernels)
    return out


@dataclass(frozen=True, slots=True)
class BlockBuilder:
    """Builds the segments of one layer/embedding/head for one micro-batch on one TP rank."""

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

    @property
    def _dims(self) -> tuple[int, int, int, int, int]:
        m = self.model
        n_up = 2 if m.activation == "swiglu" else 1
        return m.hidden, m.q_dim // self.t, m.kv_dim // self.t, m.ffn_hidden // self.t, n_up

    def _projection_dims(self) -> list[tuple[str, int, int]]:
        """(name, in, out) per rank of each attention projection (MLA: ModelSpec.attention_projections).

        Megatron-core MLA: the low-rank down projections (``*_a_*``) are replicated on every TP rank,
        the up projections are column-parallel and ``o_proj`` is row-parallel.
        """
        out = []
        for name, d_in, d_out in self.model.attention_projections():
            if name == "o_proj":
                out.append((name, d_in // self.t, d_out))
            elif "_a_" in name:
                out.append((name, d_in, d_out))
            else:
                out.append((name, d_in, d_out // self.t))
        return out

    def _attn_in_fwd(self) -> tuple[KernelDesc, ...]:
        """QKV projection(s) of the forward: one fused GEMM, or MLA's down/up projections."""
        h, q, kv, _, _ = self._dims
        if self.model.mla is None:
            return (self._gemm_fwd("qkv", q + 2 * kv, h, gathered=True),)
        return tuple(self._gemm_fwd(n, d_out, d_in, gathered=d_in == h)  # the projections of the layer input
                     for n, d_in, d_out in self._projection_dims() if n != "o_proj")

    def _attn_in_bwd(self) -> tuple[KernelDesc, ...]:
        h, q, kv, _, _ = self._dims
        if self.model.mla is None:
            return self._gemm_bwd("qkv", q + 2 * kv, h)
        return tuple(k for n, d_in, d_out in reversed(self._projection_dims()) if n != "o_proj"
                     for k in self._gemm_bwd(n, d_out, d_in))

    @property
    def _o_in(self) -> int:
        """Input width of the output projection on this rank (a*d_v/t)."""
        return self.model.n_heads * self.model.v_head_dim // self.t

    def _attention_core(self, backward: bool) -> tuple[KernelDesc, ...]:
        """The attention kernels of this rank's queries against ``s_kv`` keys (no CP exchange)."""
        m = self.model
        heads = m.n_heads // self.t
        kv_heads = max(m.kv_heads // self.t, 1)
        if self.flash:
            return (self._flash(backward, self.s, self.s, heads, kv_heads),)
        # Unfused (Megatron "core attention"): QK^T, masked softmax (+dropout), attention x V.
        batch = self.b * heads
        scores = 2.0 * batch * self.s * self.s
        qk = Gemm("attn.qk", self.s, self.s, m.d_head, batch)
        av = Gemm("attn.av", self.s, m.d_head, self.s, batch)
        soft = MemoryBound("attn.softmax", (3 if backward else 2) * scores + (scores / 2 if self.dropout else 0))
        if backward:
            return (av, av, soft, qk, qk)
        return (qk, soft, av)

    def _flash(self, backward: bool, s_q: int, s_kv: int, heads: int, kv_heads: int) -> KernelDesc:
        name = "flash_attn.bwd" if backward else "flash_attn.fwd"
        m = self.model
        # scores use the query/key width, attention x V the value width (MLA: 192 and 128): the kernel's
        # 4*s*s*d FLOPs count both GEMMs, so d is their mean (exact for FLOPs; FA2 convention)
        d = (m.d_head + m.v_head_dim) // 2
        return Attention(name, self.b, s_q, s_kv, heads, kv_heads, d,
                                         causal=True, backward=backward)

    def _windowed(self, backward: bool, window: int) -> Segment:
        """Sliding-window attention (GPT-OSS, Mistral): each query sees its last ``window`` keys, so the
        kernel does s x w of the s x s scores (FlashAttention's local window; model FLOPs count
        w - w^2/(2s) keys per query, the same to within w/2s)."""
        heads, kv_heads = self.model.n_heads // self.t, max(self.model.kv_heads // self.t, 1)
        name = "flash_attn.bwd" if backward else "flash_attn.fwd"
        d = (self.model.d_head + self.model.v_head_dim) // 2
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
        window = self.model.attention_window(layer) if layer is not None else None
        if self.cp == 1 and window is not None and window < self.s and self.flash:
            return [self._windowed(backward, window)]
        if self.cp == 1:
            return [self._attention_core(backward)]
        m = self.model
        heads, kv_heads = m.n_heads // self.t, max(m.kv_heads // self.t, 1)
        kv_bytes = 2.0 * 2.0 * self.T * kv_heads * m.d_head  # K and V of the local tokens, bf16
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
        qkv = 2.0 * self.T * (heads + 2 * kv_heads) * m.d_head
        out = 2.0 * self.T * heads * m.d_head
        attn = (self._flash(backward, s_full, s_full, heads // self.cp, max(kv_heads // self.cp, 1)),)
        first, last = (out, qkv) if backward else (qkv, out)
        return [Comm(ALL_TO_ALL, first, "cp"), attn, Comm(ALL_TO_ALL, last, "cp")]

    def _torch_ring(self, backward: bool, heads: int) -> list[Segment]:
        """torch's ring attention (``torch_cp``): the expanded K and V all-gathered beside the first block,
        then ``cp`` blocks with their merges and concatenations; in backward the fp32 dK, dV ring."""
        d = self.model.d_head
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
        m = self.model
        share = (1.0 + 0.75 * (self.cp - 1)) / self.cp
        elems = self.T * heads * m.v_head_dim
        if backward:
            elems = self.T * (heads + 2 * kv_heads) * m.d_head
        return MemoryBound("cp_merge.bwd" if backward else "cp_merge", 10.0 * share * elems)

    def selective_recompute(self, layer: int | None, modules: tuple[str, ...]) -> tuple[KernelDesc, ...]:
        """Kernels selective recompute re-runs before a layer's backward (see memory._selective_recompute)."""
        out: list[KernelDesc] = []
        if "core_attn" in modules and not self.flash:
            out += self._attention_core(backward=False)
        if "layernorm" in modules:
            out += [self._norm("ln1.recompute", False), self._norm("ln2.recompute", False)]
        if "mla_up_proj" in modules and self.model.mla is not None:
            out += [self._gemm_fwd(n + ".recompute", d_out, d_in) for n, d_in, d_out in self._projection_dims()
                    if n != "o_proj" and "_a_" not in n]
        if "act" in modules:
            moe = self.model.moe if layer is not None and self.model.is_moe_layer(layer) else None
            n_up = 2 if self.model.activation == "swiglu" else 1
            if moe is None:
                out.append(MemoryBound("act.recompute", (n_up + 1) * 2.0 * self.T * self._dims[3]))
            else:
                tokens, k, local, m_e, f_e, f_s = self._moe_dims()
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
        moe = layer is not None and m.is_moe_layer(layer)
        _, q, kv, f, n_up = self._dims
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

    def _mlp_forward(self, moe: bool) -> list[Segment]:
        h, _, _, f, n_up = self._dims
        if moe:
            return self._moe_forward()
        act = MemoryBound("act", (n_up + 1) * 2.0 * self.T * f)
        return [(self._gemm_fwd("mlp_up", n_up * f, h, gathered=True), act, self._gemm_fwd("mlp_down", h, f))]

    def _mlp_backward(self, moe: bool) -> list[Segment]:
        h, _, _, f, n_up = self._dims
        if moe:
            return self._moe_backward()
        act = MemoryBound("act.bwd", (2 * n_up + 1) * 2.0 * self.T * f)
        return [(*self._gemm_bwd("mlp_down", h, f), act, *self._gemm_bwd("mlp_up", n_up * f, h))]

    def _layer_forward(self, layer: int | None = None) -> list[Segment]:
        """Forward segments of transformer layer ``layer`` (None: the model's common dense layer)."""
        h, q, kv, f, n_up = self._dims
        moe = layer is not None and self.model.is_moe_layer(layer)
        ln1, ln2 = self._norm("ln1", False), self._norm("ln2", False)
        rope = (MemoryBound("rope", 2 * 2.0 * self.T * (q + kv)),) if self.model.position == "rope" else ()
        attn: list[Segment] = [(*self._attn_in_fwd(), *rope), *self._attention_segments(False, layer),
                               (self._gemm_fwd("out_proj", h, self._o_in),)]
        mlp = self._mlp_forward(moe)
        res1, res2 = self._residual("residual1", False), self._residual("residual2", False)
        size = 2.0 * self.T * h
        if self.t == 1:
            return merge([(ln1,), *attn, (res1, ln2), *mlp, (res2,)])
        if not self.sp:
            return merge([(ln1,), *attn, Comm(ALL_REDUCE, size), (res1, ln2), *mlp, Comm(ALL_REDUCE, size),
                          (res2,)])
        gather = self._gather_bytes(size)
        amax_attn, amax_mlp = self._amax("attn_fwd"), self._amax("mlp_fwd")
        if moe:  # tokens stay sequence-sharded into the MoE block; dispatch moves them (Megatron-core)
            return merge([(ln1,), *amax_attn, Comm(ALL_GATHER, gather), *attn, Comm(REDUCE_SCATTER, size),
                          (res1, ln2), *mlp, (res2,)])
        return merge([(ln1,), *amax_attn, Comm(ALL_GATHER, gather), *attn, Comm(REDUCE_SCATTER, size),
                      (res1, ln2), *amax_mlp, Comm(ALL_GATHER, gather), *mlp, Comm(REDUCE_SCATTER, size),
                      (res2,)])

    def _layer_backward(self, layer: int | None = None) -> list[Segment]:
        """Backward segments of transformer layer ``layer`` (reverse order of the forward)."""
        h, q, kv, f, n_up = self._dims
        moe = layer is not None and self.model.is_moe_layer(layer)
        rope = (MemoryBound("rope.bwd", 2 * 2.0 * self.T * (q + kv)),) if self.model.position == "rope" else ()
        attn: list[Segment] = [self._gemm_bwd("out_proj", h, self._o_in), *self._attention_segments(True, layer),
                               (*rope, *self._attn_in_bwd())]
        mlp = self._mlp_backward(moe)
        res1, res2 = self._residual("residual1.bwd", True), self._residual("residual2.bwd", True)
        ln1, ln2 = self._norm("ln1.bwd", True), self._norm("ln2.bwd", True)
        size = 2.0 * self.T * h
        if self.t == 1:
            return merge([(res2,), *mlp, (ln2, res1), *attn, (ln1,)])
        megatron_linears = not self.dtensor_tp if self.sp else self.tp_async_grad_allreduce
        if megatron_linears:  # asynchronous input-gradient reductions (``_column_backward``)
            attn = [*attn[:-1], *self._column_backward((*rope, *self._attn_in_bwd()), len(rope))]
            if not moe:
                dense = mlp[0]
                assert isinstance(dense, tuple)
                mlp = self._column_backward(dense, next(i for i, k in enumerate(dense) if k.name.startswith("mlp_up")))
            # SP: the output gradient of each row-parallel layer is all-gathered (an MoE block gathers its own),
            # after the all-reduce of its FP8 amax where current scaling runs one; no SP: an MoE block's input
            # gradient is all-reduced after it
            out_grad: list[Segment] = [Comm(ALL_GATHER, size)] if self.sp else []
            before_mlp = [] if moe else [*self._amax("mlp_bwd"), *out_grad]
            after_mlp: list[Segment] = [Comm(ALL_REDUCE, size)] if moe and not self.sp else []
            return merge([(res2,), *before_mlp, *mlp, *after_mlp, (ln2, res1), *self._amax("attn_bwd"), *out_grad,
                          *attn, (ln1,)])
        if not self.sp:
            return merge([(res2,), *mlp, Comm(ALL_REDUCE, size), (ln2, res1), *attn, Comm(ALL_REDUCE, size),
                          (ln1,)])
        summed = Comm(REDUCE_SCATTER, size, fusable=False)  # dX of separate projections
        amax_attn, amax_mlp = self._amax("attn_bwd"), self._amax("mlp_bwd")
        if moe:
            return merge([(res2,), *mlp, (ln2, res1), *amax_attn, Comm(ALL_GATHER, size), *attn, summed,
                          (ln1,)])
        return merge([(res2,), *amax_mlp, Comm(ALL_GATHER, size), *mlp, summed, (ln2, res1),
                      *amax_attn, Comm(ALL_GATHER, size), *attn, summed, (ln1,)])

    def _column_backward(self, kernels: tuple[KernelDesc, ...], first_column: int) -> list[Segment]:
        """Megatron's backward of column-parallel GEMMs (``kernels[first_column:]``, their dgrad and wgrad
        GEMMs, after ``kernels[:first_column]``): the dgrads, then the wgrads beside the asynchronous
        reduction of the input gradient the dgrads produced; with sequence parallelism the input, saved
        as its shard, is all-gathered again beside the dgrads and the wgrads wait for it.

        Megatron's ``LinearWithGradAccumulationAndAsyncCommunication.backward``: with sequence
        parallelism it all-gathers the saved input shard asynchronously while the dgrad GEMM runs, then
        reduce-scatters the input gradient asynchronously while the wgrad GEMM runs (Korthikanti et al.
        2022, sec. 4.2.2); without, it all-reduces the input gradient asynchronously beside the wgrad GEMM
        (``async_grad_allreduce``, on by default since Megatron-LM v2.6). Transformer Engine's userbuffers
        run the first two as "bulk" overlaps (``initialize_ub`` defaults: ``qkv_dgrad`` / ``fc1_dgrad``
        all-gather beside dgrad, ``qkv_wgrad`` / ``fc1_wgrad`` reduce-scatter beside wgrad); its linears
        all-reduce asynchronously without SP. None of them is split into GEMM chunks.
        """
        size = 2.0 * self.T * self.model.hidden
        column = kernels[first_column:]
        wgrads = tuple(k for k in column if k.name.endswith(".wgrad"))
        dgrads = tuple(k for k in column if not k.name.endswith(".wgrad"))
        if not self.sp:
            return [(*kernels[:first_column], *dgrads), Comm(ALL_REDUCE, size, fusable=False).overlapped(),
                    wgrads]
        return [kernels[:first_column], Comm(ALL_GATHER, size, fusable=False).overlapped(), dgrads,
                Comm(REDUCE_SCATTER, size, fusable=False).overlapped(), wgrads]

    # -- mixture of experts ----------------------------------------------------------------------
    @property
    def _moe_tokens(self) -> int:
        """Tokens entering this rank's MoE block: T/t with sequence parallelism (T with t = 1)."""
        return self.T // self.t if self.t > 1 else self.T

    def _moe_dims(self) -> tuple[int, int, int, int, int, int]:
        """(tokens, top_k, local experts, tokens per local expert, expert ffn per rank, shared ffn)."""
        moe = self.model.moe
        assert moe is not None
        tokens = self._moe_tokens
        local = moe.n_experts // self.ep
        # balanced routing: the EP group's tokens x top_k copies spread evenly over all experts, so
        # each rank's experts see tokens x top_k copies; expert TP gathers its etp ranks' copies
        per_expert = max(tokens * moe.top_k * self.etp // local, 1)
        return tokens, moe.top_k, local, per_expert, moe.ffn_hidden // self.etp, moe.n_shared_experts * moe.shared_ffn

    def _experts(self, backward: bool) -> tuple[KernelDesc, ...]:
        """Grouped GEMMs of the local experts (kernels named ``expert.*``: the engine scales them by the
        rank's routed load, see simtrain.plan.routing)."""
        h, n_up = self.model.hidden, 2 if self.model.activation == "swiglu" else 1
        _, _, local, m_e, f_e, _ = self._moe_dims()
        if not backward:
            return (Gemm("expert.up", m_e, n_up * f_e, h, local, grouped=True),
                    MemoryBound("expert.act", (n_up + 1) * 2.0 * m_e * local * f_e),
                    Gemm("expert.down", m_e, h, f_e, local, grouped=True))
        return (Gemm("expert.down.dgrad", m_e, f_e, h, local, grouped=True),
                Gemm("expert.down.wgrad", f_e, h, m_e, local, grouped=True),
                MemoryBound("expert.act.bwd", (2 * n_up + 1) * 2.0 * m_e * local * f_e),
                Gemm("expert.up.dgrad", m_e, h, n_up * f_e, local, grouped=True),
                Gemm("expert.up.wgrad", h, n_up * f_e, m_e, local, grouped=True))

    def _sorted_experts(self, backward: bool) -> tuple[KernelDesc, ...]:
        """The local experts between Megatron's second permutation and its inverse: with several local
        experts, the all-to-all dispatcher sorts the received tokens by local expert and unsorts the
        experts' output before the combine (``sort_chunks_by_idxs``, fused by TE under
        ``moe_permute_fusion``: one read and one write of the k x tokens copies; megatron/core/transformer/
        moe/token_dispatcher.py ``dispatch_postprocess`` / ``combine_preprocess``). DeepEP dispatches
        straight to its permuted layout, which the permute before dispatch already stands for."""
        experts = self._experts(backward)
        _, _, local, m_e, _, _ = self._moe_dims()
        if self.ep == 1 or local == 1 or self.ep_dedup:
            return experts
        copies = float(m_e * local * self.model.hidden)
        # forward: sort the dispatched tokens (the dispatch's precision), unsort the BF16 outputs;
        # backward: the gradients of both, BF16
        first = 2.0 if backward else self.dispatch_bytes_per_elem
        sort = MemoryBound("expert.sort_chunks" + (".bwd" if backward else ""), 2 * first * copies)
        unsort = MemoryBound("expert.unsort_chunks" + (".bwd" if backward else ""), 2 * 2.0 * copies)
        return (unsort, *experts, sort) if backward else (sort, *experts, unsort)

    def _shared(self, backward: bool) -> tuple[KernelDesc, ...]:
        h, n_up = self.model.hidden, 2 if self.model.activation == "swiglu" else 1
        tokens, _, _, _, _, f_s = self._moe_dims()
        if not f_s:
            return ()
        if not backward:
            return (Gemm("shared.up", tokens, n_up * f_s, h),
                    MemoryBound("shared.act", (n_up + 1) * 2.0 * tokens * f_s), Gemm("shared.down", tokens, h, f_s))
        return (Gemm("shared.down.dgrad", tokens, f_s, h), Gemm("shared.down.wgrad", f_s, h, tokens),
                MemoryBound("shared.act.bwd", (2 * n_up + 1) * 2.0 * tokens * f_s),
                Gemm("shared.up.dgrad", tokens, h, n_up * f_s), Gemm("shared.up.wgrad", h, n_up * f_s, tokens))

    def _moe_comms(self) -> tuple[Comm, Comm, float]:
        """Dispatch and combine all-to-alls over the EP group (nccl-tests size: this rank's send buffer,
        tokens x top_k copies of h, times the busiest rank's load), and the expert-TP gather size."""
        tokens, k, _, _, _, _ = self._moe_dims()
        copies = float(tokens * k * self.model.hidden) * self.expert_load
        moe = self.model.moe
        assert moe is not None
        # DeepEP-style dispatch: a token crosses the network once per node it is routed to (at most
        # topk_group nodes under group-limited routing) and fans out over NVLink (collectives.py
        # "node_limited" a2a)
        limit = moe.topk_group if moe.group_limited else 0
        coll = (Collective(CollectiveKind.ALL_TO_ALL, NodeLimited(limit, k, moe.n_experts)) if self.ep_dedup
                else ALL_TO_ALL)
        return (Comm(coll, copies * self.dispatch_bytes_per_elem, "ep"),
                Comm(coll, copies * 2.0, "ep"), copies * 2.0 * self.etp)

    def _moe_forward(self) -> list[Segment]:
        """Router, permute, dispatch, local experts, combine, unpermute, shared experts.

        Megatron-core MoELayer with the all-to-all token dispatcher (``token_dispatcher.py``); with
        expert TP the dispatched tokens are all-gathered over the etp group and reduce-scattered after.
        With ``ep_overlap`` the shared experts run while the dispatch is in flight (Megatron
        ``--moe-shared-expert-overlap``; DeepSeek-V3 sec. 3.2.2 overlaps all-to-alls with computation).
        """
        moe = self.model.moe
        assert moe is not None
        h = self.model.hidden
        tokens, k, _, _, _, _ = self._moe_dims()
        router = (Gemm("router", tokens, moe.n_experts, h),
                  MemoryBound("router.topk", 3 * 4.0 * tokens * moe.n_experts),
                  MemoryBound("moe.permute", 2 * 2.0 * tokens * k * h))
        dispatch, combine, gathered = self._moe_comms()
        experts: list[Segment] = [self._sorted_experts(False)]
        if self.etp > 1:
            experts = [Comm(ALL_GATHER, gathered, "etp"), *experts, Comm(REDUCE_SCATTER, gathered, "etp")]
        unpermute = (MemoryBound("moe.unpermute", (k + 1) * 2.0 * tokens * h),)
        shared = self._shared(False)
        if self.ep_overlap:
            return [router, dispatch.overlapped(), shared, *experts, combine, unpermute]
        return [router, dispatch, *experts, combine, (*unpermute, *shared)]

    def _moe_backward(self) -> list[Segment]:
        """Mirror of the forward: combine's backward is a dispatch-sized all-to-all and vice versa."""
        moe = self.model.moe
        assert moe is not None
        h = self.model.hidden
        tokens, k, _, _, _, _ = self._moe_dims()
        dispatch, combine, gathered = self._moe_comms()
        unpermute = (MemoryBound("moe.unpermute.bwd", (k + 1) * 2.0 * tokens * h),)
        experts: list[Segment] = [self._sorted_experts(True)]
        if self.etp > 1:
            experts = [Comm(ALL_GATHER, gathered, "etp"), *experts, Comm(REDUCE_SCATTER, gathered, "etp")]
        router = (MemoryBound("moe.permute.bwd", 2 * 2.0 * tokens * k * h),
                  MemoryBound("router.topk.bwd", 3 * 4.0 * tokens * moe.n_experts),
                  Gemm("router.dgrad", tokens, h, moe.n_experts), Gemm("router.wgrad", h, moe.n_experts, tokens))
        grad_combine = Comm(combine.coll, combine.size_bytes, "ep")
        grad_dispatch = Comm(combine.coll, combine.size_bytes, "ep")  # gradients travel in BF16
        shared = self._shared(True)
        if self.ep_overlap:
            return [unpermute, grad_combine.overlapped(), shared, *experts, grad_dispatch, router]
        return [(*unpermute, *shared), grad_combine, *experts, grad_dispatch, router]

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
