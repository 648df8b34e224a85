"""Model FLOPs: the one convention simtrain uses for MFU.

Model FLOPs per step = 3 x forward FLOPs (forward + backward at 2x; Narayanan et al. 2021 appendix),
with forward FLOPs per layer = 2 x (QKV + out-proj + MLP weights) x tokens plus the attention
scores and attention x V, 2 x 2 x s x d_head x heads per token, counted *causally* (halved), plus
the LM head 2 x h x V per token. This is Megatron-LM's ``num_floating_point_operations`` (GQA,
SwiGLU, causal attention; reference Table E). Embedding lookups, norms, activations and recompute are
not model FLOPs. Hardware FLOPs (what the kernels execute, recompute and FlashAttention's backward
recomputation included) come from the ops the engine runs.
"""

from __future__ import annotations

from simtrain.model import ModelSpec


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training model FLOPs per token (forward + backward), causal attention counted as half."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    n_up = 2 if model.activation == "swiglu" else 1
    gemm_params = h * (q + 2 * kv) + q * h + h * f * n_up + f * h
    attention = 2 * 2 * seq_len * model.d_head * model.n_heads * 0.5
    per_layer = 2 * gemm_params + attention
    head = 2 * h * model.vocab
    return 3.0 * (model.n_layers * per_layer + head)


def model_flops_per_step(model: ModelSpec, seq_len: int, global_batch_tokens: int) -> float:
    """Model FLOPs of one optimizer step over ``global_batch_tokens`` tokens."""
    return model_flops_per_token(model, seq_len) * global_batch_tokens
