"""Kernel descriptors: what a kernel is, without any hardware.

Lowering (``simtrain.lower.blocks``, ``simtrain.lower.lowering``) describes every compute kernel by its shape and
kind only; a cost source (``simtrain.cost.cost_pass.CostSource``: the GPU roofline ``ComputeCostModel`` or a
calibrated profile through it) turns a descriptor into a time. A descriptor is a small frozen value
(hashable, so a cost pass can memoise its time), one of:

- :class:`Gemm`, a matrix multiply C[m, n] = A[m, k] @ B[k, n] (``batch`` copies);
- :class:`Attention`, a FlashAttention forward or backward kernel on one rank's heads;
- :class:`MemoryBound`, an elementwise / reduction / copy kernel that moves ``bytes`` through HBM;
- :class:`Sliced`, one of ``parts`` equal pieces of another kernel (TP comm overlap's GEMM chunks).

FLOPs and bytes are the descriptor's own count at BF16 operands (2 bytes per element); a cost source
may move other bytes (FP8 operands, a software stack's fusion), and reports them on the costed
``simtrain.lower.ops.Kernel``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from simtrain.hardware.calibrated import gemm_role, memory_op_kind

#: Keys per block of a FlashAttention kernel's inner loop: FA2's kBlockN is 64-128 by head dim, FA3's
#: Hopper forward tiles are 128 x 80-176 (flash-attn hopper/tile_size.h); 128 is their middle.
FLASH_BLOCK = 128


@dataclass(frozen=True, slots=True)
class Gemm:
    """A GEMM C[m, n] = A[m, k] @ B[k, n], ``batch`` independent copies (elements, not bytes).

    Attributes:
        name: kernel name (``qkv``, ``mlp_up.dgrad``, ``expert.down.wgrad`` ...): its role and, under
            FP8, whether it runs in FP8 follow from it (``ComputeCostModel.is_fp8_gemm``).
        grouped: the copies run as one grouped GEMM (CUTLASS grouped GEMM / TE GroupedLinear).
        a_cast_share: the share of A this rank quantises when the GEMM runs in FP8 (1/t when A was cast
            before a TP all-gather).
        row_chunks: TP comm overlap runs it as this many GEMMs of m / row_chunks rows (1: whole).
    """

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    grouped: bool = False
    a_cast_share: float = 1.0
    row_chunks: int = 1

    @property
    def flops(self) -> float:
        """2 m n k per copy, FLOPs."""
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def bytes(self) -> float:
        """A, B and C read/written once at BF16, bytes."""
        return 2.0 * (self.m * self.k + self.k * self.n + self.m * self.n) * self.batch

    @property
    def role(self) -> str:
        """``fwd``, ``dgrad`` (input gradient) or ``wgrad`` (weight gradient), from the name."""
        return gemm_role(self.name)


@dataclass(frozen=True, slots=True)
class Attention:
    """A FlashAttention kernel on ``heads`` query heads of this rank (``kv_heads`` K/V heads).

    FLOPs follow the FlashAttention convention (Dao et al. FA2 benchmark; reference Table E):
    forward 4 b s_q s_kv heads d, halved when causal; backward 2.5x the forward (it recomputes
    Q K^T). Bytes: Q, K, V, O (backward also dO, dQ, dK, dV) at BF16.
    """

    name: str
    b: int
    s_q: int
    s_kv: int
    heads: int
    kv_heads: int
    d: int
    causal: bool
    backward: bool

    @property
    def forward_flops(self) -> float:
        """FLOPs of the forward kernel of this shape."""
        return 4.0 * self.b * self.s_q * self.s_kv * self.heads * self.d * (0.5 if self.causal else 1.0)

    @property
    def flops(self) -> float:
        """FLOPs of this kernel (FlashAttention convention)."""
        return 2.5 * self.forward_flops if self.backward else self.forward_flops

    @property
    def bytes(self) -> float:
        """HBM bytes: Q and O (2 b s_q heads d each), K and V (b s_kv kv_heads d each), doubled in backward."""
        qo = 2.0 * self.b * self.s_q * self.heads * self.d
        kv = 2.0 * 2.0 * self.b * self.s_kv * self.kv_heads * self.d
        return 2.0 * (2 * qo + kv) if self.backward else 2 * qo + kv

    @property
    def key(self) -> tuple[int, int, int, int, int, int, bool, bool]:
        """The shape a calibrated profile's attention table is keyed by."""
        return (self.b, self.s_q, self.s_kv, self.heads, self.kv_heads, self.d, self.causal, self.backward)


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """A memory-bound kernel (norm, RoPE, activation, residual add, loss, cast, copy, optimizer step ...)
    moving ``bytes`` through HBM (unfused count: a stack's fusion scales it when costed)."""

    name: str
    bytes: float
    flops: float = 0.0

    @property
    def kind(self) -> str:
        """The operation a calibration measures for it (``simtrain.hardware.calibrated.memory_op_kind``)."""
        return memory_op_kind(self.name)


@dataclass(frozen=True, slots=True)
class Sliced:
    """One of ``parts`` equal pieces of kernel ``of`` (a TP comm overlap chunk): 1/parts of its FLOPs,
    bytes and time."""

    of: Gemm | Attention | MemoryBound
    parts: int

    @property
    def name(self) -> str:
        """The whole kernel's name."""
        return self.of.name

    @property
    def flops(self) -> float:
        """FLOPs of one piece."""
        return self.of.flops / self.parts

    @property
    def bytes(self) -> float:
        """Bytes of one piece (the descriptor's count)."""
        return self.of.bytes / self.parts


KernelDesc = Gemm | Attention | MemoryBound | Sliced
"""Any kernel descriptor."""


class NamedWork(Protocol):
    """What structural decisions read of a kernel, descriptor or costed: its name and FLOPs."""

    @property
    def name(self) -> str: ...

    @property
    def flops(self) -> float: ...


def row_chunked(kernel: KernelDesc, parts: int) -> KernelDesc:
    """GEMM ``kernel`` run as ``parts`` GEMMs of m / parts rows (TP comm overlap); other kernels unchanged."""
    if isinstance(kernel, Gemm) and parts > 1:
        return replace(kernel, row_chunks=parts)
    return kernel


def sliced(kernel: KernelDesc, parts: int) -> Sliced:
    """One of ``parts`` equal pieces of ``kernel``."""
    if isinstance(kernel, Sliced):
        raise TypeError(f"kernel {kernel.name!r} is already a slice")
    return Sliced(kernel, parts)
