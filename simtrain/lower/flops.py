"""Model FLOPs: the one convention simtrain uses for MFU.

Model FLOPs per step = 3 x forward FLOPs (forward + backward at 2x; Narayanan et al. 2021 appendix),
with forward FLOPs per layer = 2 x (QKV + out-proj + MLP weights) x tokens plus the attention
scores and attention x V, 2 x 2 x s x d_head x heads per token, counted *causally* (halved), plus
the LM head 2 x h x V per token. This is Megatron-LM's ``num_floating_point_operations`` (GQA,
SwiGLU, causal attention; reference Table E). Embedding lookups, norms, activations, biases and
recompute are not model FLOPs. Hardware FLOPs (what the kernels execute, recompute and
FlashAttention's backward recomputation included) come from the ops the engine runs.

Each block's FLOPs are its description's (``ModelSpec.layer`` -> ``simtrain.spec.layer_desc``: every
component's GEMM weights and the attention core's keys per query); this module adds them up.

Extensions, each reducing to the dense formula above for a dense model (bit-identical):

- **MoE** (Megatron ``num_floating_point_operations`` MoE branch): a token's MLP FLOPs are those of
  its top-k routed experts plus the shared experts plus the router GEMM 2·h·E; dense layers of an
  MoE model (DeepSeek-V3's first three) count their dense MLP.
- **MLA** (DeepSeek-V3 report §2.1.1): the GEMMs are MLA's projections
  (``ModelSpec.attention_projections``, the training form without weight absorption); scores use
  the query/key head width d_h + d_h^R and attention x V the value head width d_v.
- **Sliding window** w (GPT-OSS, Mistral): a query at position p sees min(p + 1, w) keys. In the
  same continuous approximation as "causal = half" (mean keys s/2), the mean over a sequence of s
  tokens is w - w²/(2s) for w < s (≈ w when w << s) and s/2 for w >= s; at w = s both give s/2.
- **MTP** (DeepSeek-V3 §2.2): each MTP module runs, per token, its projection M_k (2h→h), one
  transformer block and the shared LM head. Its FLOPs are executed in training, so they count by
  default (``include_mtp=True``); pass ``include_mtp=False`` for the main-model-only convention.
"""

from __future__ import annotations

from simtrain.spec.model_spec import ModelSpec

# Every per-component fact (GEMM weights, attention keys per query) is in ``simtrain.spec.layer_desc``;
# this module sums the description of each block (``ModelSpec.layer``) and adds the head and MTP.


def attention_keys_per_query(model: ModelSpec, layer: int, seq_len: int) -> float:
    """Mean keys a query of block ``layer`` attends to in a causal sequence of ``seq_len`` tokens.

    Full causal: s/2 (Megatron convention). Sliding window w < s: w - w²/(2s) (the same continuous
    approximation, exact in the limit; module docstring).
    """
    return model.layer(layer).attention.core.keys_per_query(seq_len)


def ffn_gemm_params_per_token(model: ModelSpec, layer: int) -> int:
    """MLP GEMM weights one token multiplies through in block ``layer`` (no biases).

    Dense: (n_in + 1)·h·f. MoE: router h·E + top-k·(n_in + 1)·h·f_e + n_s·(n_in + 1)·h·f_s
    (Megatron ``num_floating_point_operations``: routed top-k + shared experts; router GEMM added).
    """
    return model.layer(layer).ffn.gemm_weights_per_token()


def layer_forward_flops_per_token(model: ModelSpec, layer: int, seq_len: int) -> float:
    """Forward model FLOPs of block ``layer`` per token: 2 x GEMM weights + causal attention."""
    return model.layer(layer).forward_flops_per_token(seq_len)


def mtp_forward_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward model FLOPs per token of all MTP modules: M_k (2h→h) + block + shared LM head each."""
    proj = model.mtp_around_block().gemm_weights_per_token()  # M_k (2h→h); its norms do no GEMM
    head = model.lm_head_component().gemm_weights_per_token()
    total = 0.0
    for k in range(1, model.mtp_depth + 1):
        block = layer_forward_flops_per_token(model, model.n_layers + k - 1, seq_len)
        total += 2 * proj + block + 2 * head
    return total


def model_flops_per_token(model: ModelSpec, seq_len: int, include_mtp: bool = True) -> float:
    """Training model FLOPs per token (forward + backward), causal attention counted as half.

    ``include_mtp``: count the multi-token-prediction modules (executed in training, DeepSeek-V3
    §2.2); no effect on models without MTP.
    """
    blocks = [model.layer(i) for i in range(model.n_layers)]  # alive here, so their ids are unique
    per_block: dict[int, float] = {}  # blocks alike are one cached object: each is evaluated once
    for block in blocks:
        if id(block) not in per_block:
            per_block[id(block)] = block.forward_flops_per_token(seq_len)
    body = sum(per_block[id(block)] for block in blocks)
    head = 2 * model.lm_head_component().gemm_weights_per_token()
    mtp = mtp_forward_flops_per_token(model, seq_len) if include_mtp and model.mtp_depth else 0.0
    return 3.0 * (body + head + mtp)


def model_flops_per_step(
    model: ModelSpec, seq_len: int, global_batch_tokens: int, include_mtp: bool = True
) -> float:
    """Model FLOPs of one optimizer step over ``global_batch_tokens`` tokens."""
    return model_flops_per_token(model, seq_len, include_mtp) * global_batch_tokens
