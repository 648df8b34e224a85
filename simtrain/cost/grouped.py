"""Grouped GEMMs of routed experts: tile quantisation per expert when each expert's rows are uneven.

A routed expert's GEMM has as many rows as the token copies routed to it, and each expert's GEMM is
tiled on its own: the grouped GEMMs of the stacks pad every expert's rows to whole output tiles, not the
group's sum. Transformer Engine's ``GroupedLinear`` (Megatron-core ``TEGroupedMLP``) runs one cuBLAS GEMM
per expert, spread over ``num_streams = 4`` compute streams (transformer_engine/common/gemm/
cublaslt_gemm.cu ``nvte_multi_stream_cublas_gemm``; ``constexpr int num_streams = 4`` in
include/transformer_engine/gemm.h) [src]; CUTLASS grouped GEMMs (torch ``_grouped_mm``) schedule each
problem's own tiles; DeepGEMM's contiguous grouped layout requires every expert's segment aligned to its
block M (``get_mk_alignment_for_contiguous_layout``, 128 rows) [src]. The concurrent streams (or the one
grouped kernel) fill the GPU's waves with all experts' tiles together, which ``gemm_efficiency(groups=)``
already models; what the balanced shape misses is that the rows are uneven.

Even when routing is balanced on average (Megatron's ``moe_router_force_load_balancing``, which NeMo's
performance recipes set, routes each token to ``top_k`` experts drawn at random), the count an expert
receives out of a micro-batch is binomial: mean m, variance m (1 - k/E) <= m. So each expert's rows are
X ~ Normal(m, sqrt(m)) (the Poisson bound of that spread; learned routing spreads them wider, Wang et
al. 2024, arXiv 2408.15664, "MaxVio"), and its padded rows E[ceil(X / tile)] x tile exceed m by about
half a tile once the spread is a third of a tile or more (m >~ 2,000 rows at 128-row tiles) [derived].
Weight-gradient GEMMs reduce over the routed rows (their output is the weight's shape), so only the
row dimension of forward and data-gradient GEMMs is quantised this way.
"""

from __future__ import annotations

import math

#: Standard deviations beyond which a tile is certainly (not) reached: P(|Z| > 8) ~ 1e-15.
_TAIL_SD = 8.0


def expected_tiles(mean_rows: float, tile: int) -> float:
    """Expected output-tile rows of one expert, E[ceil(X / tile)], for routed rows X ~ Normal(mean_rows,
    sqrt(mean_rows)) clipped at 0: sum over j >= 0 of P(X > j * tile) (tiles, not rows)."""
    if mean_rows <= 0:
        return 0.0
    sd = math.sqrt(mean_rows)
    first = max(0, math.floor((mean_rows - _TAIL_SD * sd) / tile))  # every tile below it is certain
    last = math.ceil((mean_rows + _TAIL_SD * sd) / tile)
    scale = sd * math.sqrt(2.0)
    return first + sum(0.5 * math.erfc((j * tile - mean_rows) / scale) for j in range(first, last + 1))


def routed_tile_factor(name: str, m: int, grouped: bool, tile: int) -> float:
    """Rate of a routed-expert GEMM relative to the balanced shape ``gemm_efficiency`` costs: its tiles
    at the mean ``m`` rows per expert, ceil(m / tile), over the expected tiles of uneven rows
    (``expected_tiles``). 1 for GEMMs that are not grouped and for weight-gradient GEMMs (``.wgrad``),
    whose rows are the weight's."""
    if not grouped or name.endswith(".wgrad") or m <= 0:
        return 1.0
    return math.ceil(m / tile) / expected_tiles(float(m), tile)
