"""Compute cost model: the time of one kernel from its hardware FLOPs and HBM bytes.

time = max(flops / (peak * efficiency), bytes / (HBM bandwidth * efficiency)) + launch overhead
(the roofline of DESIGN.md "Costs"; Calculon's ``roofline`` mode). GEMM efficiency is the GPU
profile's sustained fraction of peak on a large, well-aligned shape (``gemm_efficiency``: a typical
randn GEMM such as 8192^3 in a back-to-back loop where one is published, else the best-shape MAMF of
the ml-engineering table scaled by the typical/MAMF ratio measured on A100; reference Table D) times
tile and wave quantisation for the exact shape (NVIDIA *Matrix Multiplication Background User's
Guide*) and a reduction-depth factor (``depth_factor``: short-K GEMMs pay each tile's fixed cost).
FlashAttention runs at the profile's fraction of peak for its fused kernel at a reference shape, scaled to
the stack's kernel, key length, causal mask and head dim by the FA3 paper's measured rates
(``simtrain.cost.attention_rates``); its FLOPs follow the FlashAttention convention (Table E): forward
4*b*s^2*a*d (halved when causal), backward 2.5x forward (it recomputes Q K^T).

Memory-bound kernels run at ``memory_op_efficiency`` of HBM peak plus ``kernel_launch_s``: a latency +
bandwidth curve over their size. Checked against a public size sweep (tile-ai/TileOPs#2033, an elementwise
SiLU on an idle H200, CUPTI kernel time: 4.2M-268M elements, 17 MB-1.07 GB of traffic, 6.1-255 us, which
fits 2.1 us + bytes / (0.88 x 4.8 TB/s)): this model is the slower at every size measured there, so it
claims no ramp-up below that; 0.72 stays the rule of thumb for the mix of norms, RoPE and activations.

A software stack (``simtrain.spec.stacks``) scales memory-bound ops by its fusion (HBM traffic and
kernels launched) and picks FlashAttention-2 or -3; the CPU's issue of the kernels is the cost
pass's host model (``simtrain.cost.host``).
FP8 (``dtype="fp8"``) runs the linear-layer GEMMs at the FP8 peak times the FP8 MAMF fraction,
plus the quantisation casts of their activation operands (``FP8_CAST_BYTES``); attention, the LM
head and the router stay BF16 (Transformer Engine and torchtitan float8 convert only the
transformer blocks' linear layers).
FP4 (``dtype="fp4"``, NVFP4: Transformer Engine's ``NVFP4BlockScaling``) runs the same GEMMs at the FP4 peak
times its sustained fraction (``GpuSpec.fp4_gemm_efficiency``), with NVFP4 operand bytes and the recipe's
quantisation kernels (``simtrain.lower.nvfp4``: row-wise and column-wise copies, the random Hadamard
transform's extra read on activations and gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simtrain.cost.attention_rates import Kind, head_dim_factor, profile_kernel, shape_factor
from simtrain.cost.grouped import routed_tile_factor
from simtrain.hardware.calibrated import CalibratedCompute
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.kernels import Attention, Gemm, KernelDesc, MemoryBound, Sliced
from simtrain.lower.nvfp4 import (
    FP4_DEPTH_FACTOR,
    NVFP4_CAST_BYTES_RHT,
    NVFP4_CAST_BYTES_WEIGHT,
    nvfp4_gemm_bytes,
)
from simtrain.lower.offload import copy_s
from simtrain.lower.ops import Kernel
from simtrain.spec.stacks import SoftwareStack

TILE_M = 128
TILE_N = 128  # cuBLAS/CUTLASS Hopper and Ampere BF16 kernels tile output in multiples of 128x128
# (``GpuSpec.gemm_tile_m/n`` default; Blackwell profiles give their own tile, see ``gemm_efficiency``)
#: Reduction depth (BF16 elements) whose main-loop time equals an output tile's fixed cost (filling the
#: operand pipeline, then storing the tile): a GEMM of depth K runs at K / (K + K_FIXED) of the
#: long-K rate. 128 fits XLA's measured sm_90 BF16 table (openxla/xla
#: xla/service/gpu/model/matmul_interpolator_data.h, b 1-4, m/n/k 256-4096): over its 118 kernels
#: longer than 20 us, |log error| of this cost model falls from median 4.1 % / p90 18.2 % (tile x
#: wave only; K = 256-512 predicted 16-22 % too fast) to 2.7 % / 5.9 %. FP8 streams twice the elements
#: per main-loop step, so its depth doubles (same fixed time) [derived].
K_FIXED = 128
#: Depth of the shape the profiles' ``gemm_efficiency`` was measured on (8192^3 randn on A100; the
#: MAMF-derived Hopper/Blackwell values are scaled to it): the depth factor is 1 there.
K_REFERENCE = 8192

#: HBM bytes per element to quantise a GEMM operand to FP8 with its transposed copy (read bf16 2 +
#: write fp8 1 + transposed fp8 1, Transformer Engine ``cast_transpose``); per-tensor current scaling
#: first reads the tensor once more for its amax (+2) [derived from the kernels' reads and writes].
FP8_CAST_BYTES = {"delayed": 4.0, "blockwise": 4.0, "current": 6.0}
# Checked for MXFP8 on Blackwell (simulated as "blockwise"): Transformer Engine's MXFP8 recipe quantises
# each operand once into a row-wise and a column-wise FP8 copy with one E8M0 scale byte per 32-element
# 1-D block each (TE user guide, low_precision_training/mxfp8): 2 + 1 + 1 + 2/32 = 4.06 bytes per element,
# within 1.6 % of "blockwise"'s 4.0, so it shares that entry rather than a recipe of its own.
#: Per-tensor FP8 recipes whose backward GEMMs (dgrad, wgrad) promote partial sums to FP32 ("split
#: accumulation"): Transformer Engine's ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True`` (``_2X_ACC_FPROP = False``;
#: transformer_engine/pytorch/module/base.py) and torchao float8's default ``gemm_config_grad_input`` /
#: ``gemm_config_grad_weight`` without ``use_fast_accum`` (the forward output uses it; pytorch/ao#2377).
#: On Hopper this costs ``GpuSpec.fp8_split_accumulation_slowdown``. Blockwise scaling (DeepSeek's
#: DeepGEMM) promotes inside the kernel every 128 K-elements, overlapped with the next MMA (DeepSeek
#: technical report, arXiv 2412.19437 sec. 3.3.2), at the profile's FP8 rate.
SPLIT_ACCUMULATION_RECIPES = ("delayed", "current")
#: GEMMs that stay BF16 under FP8 training (name prefixes as ``simtrain.lower.blocks`` emits them).
BF16_GEMM_PREFIXES = ("lm_head", "attn.", "router", "mtp.proj")


def depth_factor(k: int, k_fixed: int = K_FIXED) -> float:
    """Rate of a depth-``k`` GEMM relative to the reference depth: (k / (k + k_fixed)) normalised to 1
    at ``K_REFERENCE`` (each output tile pays a fixed prologue/epilogue time besides its k-long main loop)."""
    return (k / (k + k_fixed)) * (K_REFERENCE + k_fixed) / K_REFERENCE


@dataclass(frozen=True, slots=True)
class ComputeCostModel:
    """Per-kernel time on one GPU for one compute dtype.

    ``calibration`` (from a calibrated profile, ``simtrain/hardware/profile.py``) replaces the roofline for
    every kernel it covers with the measured/fitted time (``simtrain/hardware/calibrated.py``).
    """

    gpu: GpuSpec
    dtype: str = "bf16"
    calibration: CalibratedCompute | None = None
    stack: SoftwareStack | None = None
    """Software stack (fusion, CPU launch cost, attention kernel); None = fused kernels, best attention."""
    fp8_recipe: str = "delayed"
    """FP8 scaling recipe (``FP8_CAST_BYTES`` key) when ``dtype == "fp8"``."""
    host_Bps: float = 0.0
    """GPU <-> host copy rate per direction, bytes/s (``NodeSpec.host_link_Bps``; CPU activation
    offloading's copies); 0: unknown, a host copy cannot be costed."""

    # -- the CostSource interface (simtrain.cost.cost_pass) ---------------------------------------------
    def kernel(self, desc: KernelDesc) -> Kernel:
        """The costed kernel of descriptor ``desc``: its time (calibrated where the profile measured it,
        else the roofline), and the FLOPs and HBM bytes this GPU and stack run it with."""
        if isinstance(desc, Gemm):
            whole = self.gemm(desc.name, desc.m, desc.n, desc.k, desc.batch, desc.grouped, desc.a_cast_share)
            return self.row_chunked(whole, desc.row_chunks)
        if isinstance(desc, MemoryBound):
            return self.memory_op(desc.name, desc.bytes, desc.flops)
        if isinstance(desc, Attention):
            return self.flash_attention(desc.name, desc.b, desc.s_q, desc.s_kv, desc.heads, desc.kv_heads, desc.d,
                                        desc.causal, desc.backward)
        if isinstance(desc, Sliced):
            k, n = self.kernel(desc.of), desc.parts
            return Kernel(k.name, k.flops / n, k.bytes / n, k.time_s / n, launches=max(1, k.launches // n))
        raise TypeError(f"not a kernel descriptor: {desc!r}")

    def kernel_time(self, desc: KernelDesc) -> float:
        """Seconds of one kernel (``kernel(desc).time_s``)."""
        return self.kernel(desc).time_s

    def host_copy_s(self, nbytes: float) -> float:
        """Seconds of one copy of ``nbytes`` between GPU and host memory (``offload.copy_s``)."""
        if self.host_Bps <= 0:
            raise ValueError("a GPU <-> host copy needs the copy rate host_Bps > 0")
        return copy_s(nbytes, self.host_Bps)

    @property
    def peak_flops_per_s(self) -> float:
        """Dense peak of the compute dtype, FLOP/s."""
        return self.gpu.peak_flops_per_s(self.dtype)

    def _roofline(self, name: str, flops: float, nbytes: float, flops_eff: float, mem_eff: float,
                  peak_flops_per_s: float | None = None, kernels: int = 1, extra_s: float = 0.0) -> Kernel:
        """max(compute, memory) + extra + a GPU launch tail per kernel (GPU time; ``kernels`` launches)."""
        peak = self.peak_flops_per_s if peak_flops_per_s is None else peak_flops_per_s
        t_compute = flops / (peak * flops_eff) if flops else 0.0
        t_memory = nbytes / (self.gpu.hbm_Bps * mem_eff) if nbytes else 0.0
        time_s = max(t_compute, t_memory) + extra_s + kernels * self.gpu.kernel_launch_s
        # the CPU's issue time is the cost pass's host model (simtrain.cost.host), over the whole sequence
        return Kernel(name, flops, nbytes, time_s, launches=kernels)

    def is_fp8_gemm(self, name: str) -> bool:
        """True when GEMM ``name`` runs in FP8 (fp8 runs, linear layers of the transformer blocks)."""
        return self.dtype == "fp8" and not name.startswith(BF16_GEMM_PREFIXES)

    def is_fp4_gemm(self, name: str) -> bool:
        """True when GEMM ``name`` runs in NVFP4 (fp4 runs: the same linear layers as FP8 runs convert)."""
        return self.dtype == "fp4" and not name.startswith(BF16_GEMM_PREFIXES)

    def gemm_efficiency(self, m: int, n: int, k: int, groups: int = 1, fp8: bool = False,
                        fp4: bool = False) -> float:
        """Achieved fraction of peak for an (m x k) @ (k x n) GEMM: profile rate x tile x wave x depth.
        ``groups``: GEMMs launched as one grouped GEMM (MoE experts), whose tiles fill waves together.

        The output tile and the tiles in flight at once are the GPU's (``GpuSpec.gemm_tile_m/n``,
        ``gemm_tile_slots``): 128x128 per SM on Ampere/Hopper; on Blackwell a 256x128 tile per pair of
        SMs (tcgen05 ``cta_group::2`` kernels). Routed experts pad their rows to 128-row tiles (``TILE_M``):
        the uneven per-expert row counts of a grouped GEMM are costed at the 1-SM tile on every GPU."""
        tm, tn = self.gpu.gemm_tile_m, self.gpu.gemm_tile_n
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        tile_q = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n * groups
        slots = self.gpu.gemm_tile_slots
        wave_q = tiles / (math.ceil(tiles / slots) * slots)
        best = self.gpu.gemm_efficiency
        if (fp8 or fp4) and self.gpu.fp8_gemm_efficiency > 0:  # FP8 MAMF differs from BF16's (Table D)
            best = self.gpu.fp8_gemm_efficiency
        if fp4 and self.gpu.fp4_gemm_efficiency > 0:  # the FP4 GEMM's own measured rate where given
            best = self.gpu.fp4_gemm_efficiency
        k_fixed = FP4_DEPTH_FACTOR * K_FIXED if fp4 else 2 * K_FIXED if fp8 else K_FIXED
        return best * tile_q * wave_q * depth_factor(k, k_fixed)

    def gemm(self, name: str, m: int, n: int, k: int, batch: int = 1, grouped: bool = False,
             a_cast_share: float = 1.0) -> Kernel:
        """A BF16 GEMM C[m,n] = A[m,k] @ B[k,n] (``batch`` independent copies), 2mnk FLOPs each;
        ``grouped``: the copies run as one grouped GEMM (CUTLASS grouped GEMM / TE GroupedLinear);
        ``a_cast_share``: the share of A this rank quantises when the GEMM runs in FP8 (1/t when A was
        cast before a TP all-gather)."""
        return replace(self._gemm(name, m, n, k, batch, grouped, a_cast_share), shape=(m, n, k, batch))

    def _gemm(self, name: str, m: int, n: int, k: int, batch: int, grouped: bool, a_cast_share: float,
              weight_cast: bool = True) -> Kernel:
        flops = 2.0 * m * n * k * batch
        nbytes = 2.0 * (m * k + k * n + m * n) * batch
        # calibrated GEMMs were measured in the profile's dtype (BF16 on GPUs): FP8 GEMMs keep the model
        measured = (self.calibration.gemm_s(name, m, n, k, batch)
                    if self.calibration and not self.is_fp8_gemm(name) and not self.is_fp4_gemm(name) else None)
        if measured is not None:
            return Kernel(name, flops, nbytes, measured)
        if self.is_fp4_gemm(name):
            return self._fp4_gemm(name, m, n, k, batch, grouped, a_cast_share, weight_cast)
        if self.is_fp8_gemm(name):
            return self._fp8_gemm(name, m, n, k, batch, grouped, a_cast_share, weight_cast)
        # routed experts: each expert's uneven rows pad to whole tiles (simtrain.cost.grouped)
        eff = self.gemm_efficiency(m, n, k, batch if grouped else 1) * routed_tile_factor(name, m, grouped, TILE_M)
        return self._roofline(name, flops, nbytes, eff,
                              self.gpu.hbm_efficiency, peak_flops_per_s=self.gpu.bf16_flops_per_s)

    def row_chunked(self, kernel: Kernel, parts: int) -> Kernel:
        """GEMM ``kernel`` run as ``parts`` GEMMs of m / parts rows each, as TP comm overlap runs it (one
        per chunk of the collective it is fused with): its time scaled by parts x t(m / parts) / t(m),
        which adds each chunk's tile and wave quantisation and launch. Other kernels come back unchanged."""
        if kernel.shape is None or parts <= 1:
            return kernel
        m, n, k, batch = kernel.shape
        # the weight is quantised once for all chunks (a per-call cost, not a per-row one)
        whole = self._gemm(kernel.name, m, n, k, batch, grouped=False, a_cast_share=1.0, weight_cast=False).time_s
        chunk = self._gemm(kernel.name, -(-m // parts), n, k, batch, grouped=False, a_cast_share=1.0,
                           weight_cast=False).time_s
        return replace(kernel, time_s=kernel.time_s - whole + parts * chunk, launches=kernel.launches * parts)

    def _weight_cast_due(self, name: str, weight_cast: bool) -> bool:
        """Whether a quantised GEMM's forward re-quantises its weight: not for wgrad/dgrad (they reuse the
        forward's copies), not with ``weight_cast`` False (the per-row part of the time), not when the stack
        caches quantised weights across a step's micro-batches (``SoftwareStack.fp8_weight_cache``)."""
        cached = self.stack is not None and self.stack.fp8_weight_cache
        return weight_cast and not cached and not name.endswith((".wgrad", ".dgrad"))

    def _cast_s(self, nbytes: float) -> float:
        """Seconds of quantisation kernels moving ``nbytes`` bytes (memory-bound, at the memory-op rate)."""
        return nbytes / (self.gpu.hbm_Bps * self.gpu.memory_op_efficiency)

    def _fp8_gemm(self, name: str, m: int, n: int, k: int, batch: int, grouped: bool,
                  a_cast_share: float = 1.0, weight_cast: bool = True) -> Kernel:
        """An FP8 GEMM: FP8 peak x FP8 MAMF x quantisation, plus the cast of its A operand (m x k:
        the activation in forward, the output gradient in dgrad; wgrad reuses both transposed copies)
        and, with current scaling, of the weight in forward (re-quantised every forward unless the stack
        caches FP8 weights across a step's micro-batches, ``SoftwareStack.fp8_weight_cache``);
        ``weight_cast`` False leaves that weight cast out (the per-row part of the time)."""
        flops = 2.0 * m * n * k * batch
        nbytes = (m * k + k * n + 2.0 * m * n) * batch
        cast_elems = 0.0 if name.endswith(".wgrad") else float(m * k) * a_cast_share
        if self.fp8_recipe == "current" and self._weight_cast_due(name, weight_cast):
            cast_elems += k * n
        cast_s = self._cast_s(FP8_CAST_BYTES.get(self.fp8_recipe, 4.0) * cast_elems * batch)
        eff = (self.gemm_efficiency(m, n, k, batch if grouped else 1, fp8=True)
               * routed_tile_factor(name, m, grouped, TILE_M))
        if name.endswith((".dgrad", ".wgrad")) and self.fp8_recipe in SPLIT_ACCUMULATION_RECIPES:
            eff /= self.gpu.fp8_split_accumulation_slowdown
        return self._roofline(name, flops, nbytes, eff, self.gpu.hbm_efficiency, extra_s=cast_s)

    def _fp4_gemm(self, name: str, m: int, n: int, k: int, batch: int, grouped: bool,
                  a_cast_share: float = 1.0, weight_cast: bool = True) -> Kernel:
        """An NVFP4 GEMM: FP4 peak x FP4 sustained fraction x quantisation, on NVFP4 operands (0.5625 B per
        element with scales, ``nvfp4_gemm_bytes``), plus the cast of its A operand (the activation in
        forward, the output gradient in dgrad: ``NVFP4_CAST_BYTES_RHT`` per element, both copies at once;
        wgrad reuses the column-wise copies) and, in forward, of the weight (``NVFP4_CAST_BYTES_WEIGHT``)
        unless the stack caches quantised weights across the step's micro-batches
        (``SoftwareStack.fp8_weight_cache``; NVFP4 needs a fresh per-tensor amax at every quantisation, as
        FP8 current scaling does)."""
        flops = 2.0 * m * n * k * batch
        nbytes = nvfp4_gemm_bytes(m, n, k) * batch
        cast_bytes = 0.0 if name.endswith(".wgrad") else NVFP4_CAST_BYTES_RHT * m * k * a_cast_share
        if self._weight_cast_due(name, weight_cast):
            cast_bytes += NVFP4_CAST_BYTES_WEIGHT * k * n
        cast_s = self._cast_s(cast_bytes * batch)
        eff = (self.gemm_efficiency(m, n, k, batch if grouped else 1, fp4=True)
               * routed_tile_factor(name, m, grouped, TILE_M))
        return self._roofline(name, flops, nbytes, eff, self.gpu.hbm_efficiency, extra_s=cast_s)

    def flash_attention(self, name: str, b: int, s_q: int, s_kv: int, heads: int, kv_heads: int, d: int,
                        causal: bool, backward: bool) -> Kernel:
        """FlashAttention forward or backward on ``heads`` query heads of this rank.

        FLOPs (Dao et al. FA2 benchmark convention): forward 4*b*s_q*s_kv*heads*d, halved when
        causal; backward 2.5x the forward. Bytes: Q, K, V, O (and dO, dQ, dK, dV in backward).
        """
        fwd = 4.0 * b * s_q * s_kv * heads * d * (0.5 if causal else 1.0)
        qo = 2.0 * b * s_q * heads * d
        kv = 2.0 * 2.0 * b * s_kv * kv_heads * d
        if self.calibration is not None:
            flops, nbytes = (2.5 * fwd, 2.0 * (2 * qo + kv)) if backward else (fwd, 2 * qo + kv)
            measured = self.calibration.attention_s((b, s_q, s_kv, heads, kv_heads, d, causal, backward), flops)
            if measured is not None:
                return Kernel(name, flops, nbytes, measured)
        kind = self.attention_kind()
        # uncalibrated: the profile's rate at the reference shape, times this kernel's at its shape; a calibrated
        # profile's efficiency was measured at the run's own shapes, so it is not rescaled
        shape = 1.0 if self.calibration is not None else shape_factor(kind, causal, s_kv, backward, self.gpu.has_fp8)
        scale = shape * head_dim_factor(kind, d)
        bf16 = self.gpu.bf16_flops_per_s  # attention stays BF16 in FP8 training
        if backward:
            return self._roofline(name, 2.5 * fwd, 2.0 * (2 * qo + kv), self.gpu.attention_bwd_efficiency * scale,
                                  self.gpu.hbm_efficiency, peak_flops_per_s=bf16)
        return self._roofline(name, fwd, 2 * qo + kv, self.gpu.attention_fwd_efficiency * scale,
                              self.gpu.hbm_efficiency, peak_flops_per_s=bf16)

    def attention_kind(self) -> Kind:
        """The fused-attention kernel this stack runs on this GPU (``attention_rates``): FA2 where the stack
        asks for it or the GPU has no FP8 tensor cores (before Hopper FA2 is the best kernel whatever the stack
        asks for), FA3 where asked for, else the profile's kernel (cuDNN's fused attention)."""
        asked = self.stack.attention if self.stack is not None else "cudnn"
        if asked == "fa2" or not self.gpu.has_fp8:
            return "fa2"
        return "fa3" if asked == "fa3" else profile_kernel(self.gpu.has_fp8)

    def memory_op(self, name: str, nbytes: float, flops: float = 0.0) -> Kernel:
        """A memory-bound elementwise/reduction kernel moving ``nbytes`` through HBM."""
        measured = self.calibration.memory_op_s(name, nbytes) if self.calibration else None
        if measured is not None:
            return Kernel(name, flops, nbytes, measured)
        if self.stack is None:
            return self._roofline(name, flops, nbytes, 1.0, self.gpu.memory_op_efficiency)
        fusion = self.stack.fusion_of(name)
        return self._roofline(name, flops, nbytes * fusion.bytes_factor, 1.0, self.gpu.memory_op_efficiency,
                              kernels=fusion.kernels)
