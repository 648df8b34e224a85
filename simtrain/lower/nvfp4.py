"""NVFP4 training (``train.precision = "fp4"``): the bytes of its quantisation kernels, GEMM operands, cached
weights and saved activations (the cost pass, ``simtrain.cost.costs``, and the memory model use them).

The recipe is Transformer Engine's ``NVFP4BlockScaling`` (transformer_engine/common/recipe/__init__.py; NVIDIA,
"Pretraining Large Language Models with NVFP4", arXiv 2509.25149), which Megatron-core builds for
``--fp4-format e2m1 --fp4-recipe nvfp4`` and Megatron-Bridge's ``bf16_with_nvfp4_mixed`` precision config
selects. What it does, as the cost model charges it:

- every GEMM of the transformer blocks' linear layers runs in FP4: fprop, dgrad and wgrad all take NVFP4
  operands (one E2M1 value of 4 bits per element, one E4M3 scale per 16 consecutive elements, one FP32 scale
  per tensor); attention's BMMs, the LM head and the router stay BF16 as under FP8 (the recipe's ``fp8_dpa``
  and ``fp8_mha`` are False, and TE quantises only its own linear modules). The paper also keeps a few
  blocks in BF16 (``first_last_layers_bf16``); Megatron-Bridge's NVFP4 performance recipes do not set it
  (``bf16_with_nvfp4_mixed`` leaves ``num_layers_at_start/end_in_bf16`` at 0), so every block runs in FP4;
- activations and output gradients are quantised once into a row-wise copy (fprop / dgrad) and a
  column-wise copy (wgrad); the column-wise copy goes through a 16-point random Hadamard transform (RHT);
  gradients are rounded stochastically (an in-kernel Philox draw: no extra HBM bytes);
- weights use 16x16 2-D blocks (one quantisation serves both orientations), no RHT.

Transformer Engine's ``NVFP4Quantizer::quantize_impl`` (transformer_engine/pytorch/csrc/quantizer.cpp) runs,
for a tensor with the RHT (activations, gradients): ``nvte_hadamard_transform_amax`` (reads the BF16 tensor
once for both amaxes: the tensor's and its RHT'd transpose's), ``nvte_quantize_v2`` for the row-wise copy
(reads it again, writes 4-bit values and scales), ``nvte_hadamard_transform_cast_fusion_columnwise`` for the
column-wise copy (reads it a third time, writes the transposed copy). Without the RHT (weights): one amax
pass (``nvte_compute_amax_with_config``) and one ``nvte_quantize_v2`` writing both copies. Each is a
memory-bound kernel, charged at the GPU's memory-op rate as the FP8 casts are (``FP8_CAST_BYTES``).
"""

from __future__ import annotations

#: Elements per NVFP4 scale block (one E4M3 scale per 16 consecutive elements; TE ``NVFP4_BLOCK_SIZE``) [src].
NVFP4_BLOCK = 16
#: HBM bytes per element of one NVFP4 copy: a 4-bit E2M1 value (0.5 B) plus its share of the block's 1-byte
#: E4M3 scale (1/16 B); the per-tensor FP32 scale is 4 bytes per tensor, nothing per element [derived].
NVFP4_COPY_BYTES = 0.5 + 1.0 / NVFP4_BLOCK
#: Bytes per element of the BF16 tensor a cast reads [spec].
BF16_BYTES = 2.0
#: HBM bytes per element to quantise an activation or output gradient (with the RHT on its column-wise
#: copy): 3 reads of the BF16 tensor (amax, row-wise cast, column-wise RHT cast) + 2 NVFP4 copies written
#: = 6 + 1.125 = 7.125 (FP8 with current scaling: 6; TE ``NVFP4Quantizer::quantize_impl``) [derived from src].
NVFP4_CAST_BYTES_RHT = 3 * BF16_BYTES + 2 * NVFP4_COPY_BYTES
#: HBM bytes per element to quantise a weight (2-D 16x16 blocks, no RHT): 2 reads (amax, one cast kernel
#: writing both copies) + 2 NVFP4 copies = 5.125 [derived from src].
NVFP4_CAST_BYTES_WEIGHT = 2 * BF16_BYTES + 2 * NVFP4_COPY_BYTES
#: Elements per main-loop step relative to BF16: the FP4 MMA consumes 4x BF16's K per instruction at the
#: same tile (tcgen05 ``kind::mxf4nvf4`` K = 64 against ``kind::f16`` K = 16; PTX ISA, tcgen05.mma shapes), so
#: the depth whose main loop equals a tile's fixed cost is 4x BF16's (FP8: 2x) [derived].
FP4_DEPTH_FACTOR = 4
#: Bytes per parameter of the NVFP4 weight copies a stack caches for the step (row-wise for fprop,
#: column-wise for dgrad; ``SoftwareStack.fp8_weight_cache``): 2 x 0.5625 = 1.125 (FP8: 1 + 1) [derived].
NVFP4_WEIGHT_CACHE_BYTES = 2 * NVFP4_COPY_BYTES
#: Share of a linear layer's BF16 input bytes kept for backward: TE saves the quantised input's column-wise
#: copy only (the wgrad operand; ``update_usage(rowwise_usage=False)`` after fprop): 0.5625 / 2 (FP8: 1 / 2)
#: [derived from src].
NVFP4_SAVED_INPUT_SHARE = NVFP4_COPY_BYTES / BF16_BYTES


def nvfp4_gemm_bytes(m: int, n: int, k: int) -> float:
    """HBM bytes of one NVFP4 GEMM C[m,n] = A[m,k] @ B[k,n]: both operands as NVFP4 copies (0.5625 B per
    element with their scales), the output in BF16 (2 B)."""
    return NVFP4_COPY_BYTES * (m * k + k * n) + BF16_BYTES * m * n
