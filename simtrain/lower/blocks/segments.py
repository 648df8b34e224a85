"""Segments: what the block builders return, and how adjacent ones are merged.

A compute segment is a tuple of kernel descriptors (``simtrain.lower.kernels``: shapes, FLOPs and bytes, no
time; ``simtrain.cost.cost_pass`` costs them); a communication segment is ``Comm(coll, size_bytes, axis)``;
ring attention's steps are a ``Ring``. Collective sizes use the nccl-tests convention (reference Table B):
the full b*s*h*2 tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from simtrain.lower.kernels import KernelDesc, NamedWork
from simtrain.spec.collective_kinds import Collective

TP_OVERLAP_CHUNKS = 4  # Megatron TP-comm overlap splits each GEMM/collective pair into chunks


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
