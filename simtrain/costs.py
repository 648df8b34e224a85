"""Compute cost model: the time of one kernel from its hardware FLOPs and HBM bytes.

time = max(flops / (peak * efficiency), bytes / (HBM bandwidth * efficiency)) + launch overhead
(the roofline of DESIGN.md "Costs"; Calculon's ``roofline`` mode). GEMM efficiency is the GPU's
best-shape MAMF fraction (ml-engineering MAMF table, reference Table D) times tile and wave
quantisation for the exact shape (NVIDIA *Matrix Multiplication Background User's Guide*).
FlashAttention uses the measured fraction of peak of its forward and backward kernels (FA2/FA3
papers, Table D); its FLOPs follow the FlashAttention convention (Table E): forward
4*b*s^2*a*d (halved when causal), backward 2.5x forward (it recomputes Q K^T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simtrain.hardware import GpuSpec
from simtrain.ops import Kernel

TILE_M = 128
TILE_N = 128  # cuBLAS/CUTLASS Hopper and Ampere BF16 kernels tile output in multiples of 128x128


@dataclass(frozen=True, slots=True)
class ComputeCostModel:
    """Per-kernel time on one GPU for one compute dtype."""

    gpu: GpuSpec
    dtype: str = "bf16"

    @property
    def peak_flops_per_s(self) -> float:
        """Dense peak of the compute dtype, FLOP/s."""
        return self.gpu.peak_flops_per_s(self.dtype)

    def _roofline(self, name: str, flops: float, nbytes: float, flops_eff: float, mem_eff: float) -> Kernel:
        t_compute = flops / (self.peak_flops_per_s * flops_eff) if flops else 0.0
        t_memory = nbytes / (self.gpu.hbm_Bps * mem_eff) if nbytes else 0.0
        return Kernel(name, flops, nbytes, max(t_compute, t_memory) + self.gpu.kernel_launch_s)

    def gemm_efficiency(self, m: int, n: int, k: int) -> float:
        """Achieved fraction of peak for an (m x k) @ (k x n) GEMM: MAMF x tile x wave quantisation."""
        tiles_m, tiles_n = math.ceil(m / TILE_M), math.ceil(n / TILE_N)
        tile_q = (m * n) / (tiles_m * TILE_M * tiles_n * TILE_N)
        tiles = tiles_m * tiles_n
        slots = self.gpu.sm_count
        wave_q = tiles / (math.ceil(tiles / slots) * slots)
        return self.gpu.gemm_efficiency * tile_q * wave_q

    def gemm(self, name: str, m: int, n: int, k: int, batch: int = 1) -> Kernel:
        """A BF16 GEMM C[m,n] = A[m,k] @ B[k,n] (``batch`` independent copies), 2mnk FLOPs each."""
        flops = 2.0 * m * n * k * batch
        nbytes = 2.0 * (m * k + k * n + m * n) * batch
        return self._roofline(name, flops, nbytes, self.gemm_efficiency(m, n, k), self.gpu.hbm_efficiency)

    def flash_attention(self, name: str, b: int, s_q: int, s_kv: int, heads: int, kv_heads: int, d: int,
                        causal: bool, backward: bool) -> Kernel:
        """FlashAttention forward or backward on ``heads`` query heads of this rank.

        FLOPs (Dao et al. FA2 benchmark convention): forward 4*b*s_q*s_kv*heads*d, halved when
        causal; backward 2.5x the forward. Bytes: Q, K, V, O (and dO, dQ, dK, dV in backward).
        """
        fwd = 4.0 * b * s_q * s_kv * heads * d * (0.5 if causal else 1.0)
        qo = 2.0 * b * s_q * heads * d
        kv = 2.0 * 2.0 * b * s_kv * kv_heads * d
        if backward:
            return self._roofline(name, 2.5 * fwd, 2.0 * (2 * qo + kv), self.gpu.attention_bwd_efficiency,
                                  self.gpu.hbm_efficiency)
        return self._roofline(name, fwd, 2 * qo + kv, self.gpu.attention_fwd_efficiency, self.gpu.hbm_efficiency)

    def memory_op(self, name: str, nbytes: float, flops: float = 0.0) -> Kernel:
        """A memory-bound elementwise/reduction kernel moving ``nbytes`` through HBM."""
        return self._roofline(name, flops, nbytes, 1.0, self.gpu.memory_op_efficiency)
