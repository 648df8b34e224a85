"""FlashAttention's rate by kernel, sequence length, causal mask and head dim, relative to the GPU profile.

A GPU profile's ``attention_fwd_efficiency`` / ``attention_bwd_efficiency`` is the sustained fraction of the
BF16 peak that its fused-attention kernel reaches at the *reference shape*: head dim 128, no mask, 16k keys,
where the measured rates have flattened (``REFERENCE_KEYS``). The kernel is cuDNN's fused attention on GPUs
with FP8 tensor cores (Transformer Engine's ``FusedAttention``, which TE picks over flash-attn on Hopper and
later "for performance reasons": ``get_attention_backend`` in transformer_engine's dot_product_attention
utils) and FlashAttention-2 before them. A kernel of another shape runs at that rate times
``shape_factor``: the measured rate of its kernel at its key length and mask over the profile kernel's rate
at the reference shape, and ``head_dim_factor``.

Why the rate moves with the shape (FA3 paper sec. 4.1): each query tile's CTA loops over the key blocks, so
a short key length leaves the loop's prologue and epilogue (loading Q, writing O and the log-sum-exp)
unamortised, as a short reduction depth does for a GEMM (``costs.depth_factor``); a causal mask adds the
masked diagonal blocks and an uneven amount of work per tile, so the causal rate stays below the unmasked one
at every length (FA3 at 4k keys: 579 against 638 TFLOP/s).
"""

from __future__ import annotations

import math
from typing import Literal

Kind = Literal["cudnn", "fa3", "fa2"]

#: Key lengths of the measured rates (tokens).
KEYS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
#: The key length of the reference shape: the longest measured, where every kernel's rate has flattened.
REFERENCE_KEYS = 16384

#: Forward TFLOP/s (FlashAttention convention: causal FLOPs halved) at ``KEYS``, by kernel and causal mask:
#: H100 SXM5, BF16, head dim 128, batch x sequence = 16k tokens over 16 heads (2,048 query tiles: no wave
#: quantisation), the bar labels of Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) Fig. 5 (c)
#: (no mask) and (d) (causal) [obs], read from transcriptions of the figures' bar labels (as the reference's
#: Table D reads them; its no-mask ranges, FA3 467-648 and FA2 309-370, are these rows' ends). FA3 benchmarks
#: heat the GPU to its maximum clock first: burst rates, which the profiles scale to sustained ones; only
#: ratios of these numbers are used.
FWD_TFLOPS: dict[Kind, dict[bool, tuple[float, ...]]] = {
    "cudnn": {False: (497, 574, 617, 609, 600, 595), True: (315, 410, 484, 518, 529, 539)},
    "fa3": {False: (467, 565, 625, 638, 646, 648), True: (292, 423, 521, 579, 602, 616)},
    "fa2": {False: (309, 350, 362, 368, 370, 370), True: (191, 260, 298, 319, 333, 335)},
}
#: Backward TFLOP/s (2.5x the forward's FLOPs) at ``KEYS``, no mask: the same paper's Fig. 6, head dim 128
#: [obs]. It has no causal backward; a causal backward is taken to lose what the same kernel's causal forward
#: loses at that length (``shape_factor``) [derived: the same tiles are masked in both passes].
BWD_TFLOPS: dict[Kind, tuple[float, ...]] = {
    "cudnn": (305, 408, 465, 499, 518, 516),
    "fa3": (316, 424, 501, 542, 559, 561),
    "fa2": (214, 260, 291, 310, 318, 322),
}

#: Throughput by head dim relative to head dim 128 at 4k-16k keys, forward (Fig. 5): FA3 head dim 64
#: 476-497 TFLOP/s vs 128 638-648 (0.76), 256 up to ~740-756 (1.15); FA2 64 321-324 vs 368-370 (0.87), no
#: FA2 figure at 256 (1.0 kept); cuDNN 64 408-413 (no mask) and 363-388 (causal) vs 595-609 and 518-539
#: (0.70), 256 581 and 509 (0.96). Narrow heads do fewer FLOPs per byte of K/V and per softmax element.
#: The backward's figure orders head dims the same way; the forward ratios serve both [obs].
#: Linear in log2(head dim) between the points, clamped outside them.
HEAD_DIM_FACTOR: dict[Kind, tuple[tuple[int, float], ...]] = {
    "cudnn": ((64, 0.70), (128, 1.0), (256, 0.96)),
    "fa3": ((64, 0.76), (128, 1.0), (256, 1.15)),
    "fa2": ((64, 0.87), (128, 1.0), (256, 1.0)),
}


def _log2_interp(points: tuple[tuple[int, float], ...], x: float) -> float:
    """Linear interpolation in log2(x) through ``points`` (ascending x), clamped at both ends."""
    lx = math.log2(min(max(x, points[0][0]), points[-1][0]))
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if lx <= math.log2(x1):
            return y0 + (y1 - y0) * (lx - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    return points[-1][1]


def head_dim_factor(kind: Kind, d: int) -> float:
    """Kernel ``kind``'s rate at head dim ``d`` relative to head dim 128 (``HEAD_DIM_FACTOR``)."""
    return _log2_interp(HEAD_DIM_FACTOR[kind], d)


def _rate(kind: Kind, causal: bool, keys: float, backward: bool) -> float:
    """Measured TFLOP/s of kernel ``kind`` at ``keys`` keys (interpolated in log2, clamped to ``KEYS``)."""
    def curve(values: tuple[float, ...]) -> float:
        return _log2_interp(tuple(zip(KEYS, values, strict=True)), keys)

    fwd = FWD_TFLOPS[kind]
    if not backward:
        return curve(fwd[causal])
    unmasked = curve(BWD_TFLOPS[kind])
    return unmasked * curve(fwd[True]) / curve(fwd[False]) if causal else unmasked


def profile_kernel(has_fp8: bool) -> Kind:
    """The kernel a GPU profile's attention efficiency is the rate of: cuDNN's fused attention where the GPU
    has FP8 tensor cores (Hopper and later: Transformer Engine's choice there), else FlashAttention-2."""
    return "cudnn" if has_fp8 else "fa2"


def shape_factor(kind: Kind, causal: bool, keys: float, backward: bool, has_fp8: bool) -> float:
    """Rate of kernel ``kind`` on ``keys`` keys (``causal`` mask or none), relative to the profile's kernel
    at the reference shape (no mask, ``REFERENCE_KEYS``): the factor on the profile's efficiency. Below 512
    keys the 512-key rate holds (no measurement there), above 16k the 16k one."""
    ref = _rate(profile_kernel(has_fp8), False, REFERENCE_KEYS, backward)
    return _rate(kind, causal, keys, backward) / ref
