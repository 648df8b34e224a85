"""Convergence-aware what-if: time to a target loss against the global batch size.

This is a **model**, not a simulation: simtrain simulates the time of a step; how many steps reach a
given loss at a given batch comes from published empirical fits, with their assumptions:

- McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (arXiv:1812.06162), eq. 2.11
  and sec. 2.3: to reach a fixed loss, steps S and examples E trade off as
  ``S = S_min (1 + B_noise / B)`` and ``E = E_min (1 + B / B_noise)``, with ``E_min = S_min B_noise``;
  the critical batch size ``B_crit`` is taken equal to the gradient noise scale ``B_noise`` (their
  ``B_simple``). Below ``B_noise`` a bigger batch saves steps almost for free; above it, it mostly
  costs more tokens. Assumes the learning rate is tuned for each batch size and that ``B_noise``
  stays constant over the stretch of training considered (it grows as the loss falls).
- Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (arXiv:2001.08361), eq. 1.4: an
  estimate of the critical batch from the target loss, ``B_crit(L) = B* / L^(1/alpha_B)`` with
  ``B* = 2e8`` tokens and ``alpha_B = 0.21``, L in nats per token. Fitted on WebText2 with GPT-2's
  tokenizer: a rough guide for other data and tokenizers.
- DeepSeek LLM (DeepSeek-AI 2024, arXiv:2401.02954), sec. 3.1, eq. 1: the compute-optimal batch and
  learning rate against the compute budget C (FLOPs), ``B_opt = 0.2920 C^0.3271`` tokens and
  ``eta_opt = 0.3118 C^-0.1250``, with ``C = M D``, M the non-embedding FLOPs per token
  (``72 n_layer d_model^2 + 12 n_layer d_model l_seq``, sec. 3.1, generalised here to GQA/SwiGLU as
  6 x the non-embedding matmul parameters + 12 n_layer d_attn l_seq) and D the tokens. Fitted on
  DeepSeek's data with their training setup.

``E_min`` is anchored on the planned run: the run's token budget at its final batch is taken to reach
the target loss, so ``E_min = D / (1 + B / B_noise)``; a caller can give ``e_min_tokens`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.model import ModelSpec

# Kaplan et al. 2020 eq. 1.4 (critical batch vs loss).
KAPLAN_B_STAR_TOKENS = 2.0e8
KAPLAN_ALPHA_B = 0.21
# DeepSeek LLM 2024 eq. 1 (optimal batch and learning rate vs compute).
DEEPSEEK_B_COEF = 0.2920
DEEPSEEK_B_EXP = 0.3271
DEEPSEEK_LR_COEF = 0.3118
DEEPSEEK_LR_EXP = -0.1250

MODEL_LABEL = ("model, not simulation: McCandlish et al. 2018 (arXiv:1812.06162) S = S_min(1 + B_noise/B), "
               "E = E_min(1 + B/B_noise), B_crit = B_noise; learning rate assumed tuned per batch; B_noise "
               "assumed constant; E_min anchored on the planned run reaching the target loss")


@dataclass(frozen=True, slots=True)
class NoiseScaleModel:
    """McCandlish et al. 2018's trade-off for one target loss; batches and examples in tokens."""

    b_noise_tokens: float
    e_min_tokens: float

    @property
    def s_min_steps(self) -> float:
        """Fewest optimizer steps to the target (infinite batch): E_min / B_noise."""
        return self.e_min_tokens / self.b_noise_tokens

    def steps(self, batch_tokens: float) -> float:
        """Steps to the target at this batch: S_min (1 + B_noise / B) (eq. 2.11)."""
        return self.s_min_steps * (1.0 + self.b_noise_tokens / batch_tokens)

    def tokens(self, batch_tokens: float) -> float:
        """Tokens to the target at this batch: E_min (1 + B / B_noise) (eq. 2.11)."""
        return self.e_min_tokens * (1.0 + batch_tokens / self.b_noise_tokens)


def kaplan_critical_batch_tokens(loss_nats: float) -> float:
    """Critical batch (tokens) at a loss, Kaplan et al. 2020 eq. 1.4: B* / L^(1/alpha_B)."""
    if loss_nats <= 0:
        raise ConfigError(Problem("target_loss", f"{loss_nats!r} must be a positive loss in nats per token"))
    return KAPLAN_B_STAR_TOKENS / loss_nats ** (1.0 / KAPLAN_ALPHA_B)


def deepseek_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """DeepSeek LLM's M: non-embedding training FLOPs per token (sec. 3.1), generalised to GQA/SwiGLU.

    6 x (QKV, output-projection and MLP weights per layer) x layers + 12 x layers x d_attn x seq_len
    (attention scores and values, not halved for causality, as in the paper).
    """
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    n_up = 2 if model.activation == "swiglu" else 1
    gemm_params = h * (q + 2 * kv) + q * h + h * f * n_up + f * h
    return model.n_layers * (6.0 * gemm_params + 12.0 * q * seq_len)


def deepseek_optimal_batch_tokens(compute_flops: float) -> float:
    """Compute-optimal batch in tokens, DeepSeek LLM eq. 1: 0.2920 C^0.3271."""
    return DEEPSEEK_B_COEF * compute_flops ** DEEPSEEK_B_EXP


def deepseek_optimal_lr(compute_flops: float) -> float:
    """Compute-optimal peak learning rate, DeepSeek LLM eq. 1: 0.3118 C^-0.1250."""
    return DEEPSEEK_LR_COEF * compute_flops ** DEEPSEEK_LR_EXP


def noise_model(anchor_batch_tokens: float, anchor_tokens: float, b_noise_tokens: float | None = None,
                target_loss: float | None = None, e_min_tokens: float | None = None) -> tuple[NoiseScaleModel, str]:
    """Build the McCandlish model and say where ``B_noise`` came from.

    ``B_noise``: given, or estimated from ``target_loss`` (Kaplan et al. 2020). ``E_min``: given, or
    anchored so that ``anchor_tokens`` at ``anchor_batch_tokens`` reach the target.

    Raises:
        ConfigError: neither a noise scale nor a target loss, or non-positive values.
    """
    if b_noise_tokens is not None:
        if b_noise_tokens <= 0:
            raise ConfigError(Problem("noise_scale_tokens", f"{b_noise_tokens!r} must be positive (tokens)"))
        source = "given"
    elif target_loss is not None:
        b_noise_tokens = kaplan_critical_batch_tokens(target_loss)
        source = (f"estimated from target loss {target_loss:g} nats by Kaplan et al. 2020 eq. 1.4 "
                  f"(B* = {KAPLAN_B_STAR_TOKENS:.0e} tokens, alpha_B = {KAPLAN_ALPHA_B}; WebText2, GPT-2 tokenizer)")
    else:
        raise ConfigError(Problem("noise_scale_tokens", "give the gradient noise scale in tokens "
                                                        "(--noise-scale-tokens) or a target loss in nats "
                                                        "(--target-loss) to estimate it"))
    if e_min_tokens is None:
        e_min_tokens = anchor_tokens / (1.0 + anchor_batch_tokens / b_noise_tokens)
    return NoiseScaleModel(b_noise_tokens, e_min_tokens), source


def describe(model: NoiseScaleModel, b_noise_source: str, compute_flops: float) -> dict[str, Any]:
    """The model's label, parameters and the DeepSeek LLM reference point, for reports and JSON."""
    return {
        "model": MODEL_LABEL,
        "b_noise_tokens": model.b_noise_tokens,
        "b_noise_source": b_noise_source,
        "e_min_tokens": model.e_min_tokens,
        "s_min_steps": model.s_min_steps,
        "compute_flops": compute_flops,
        "deepseek_b_opt_tokens": deepseek_optimal_batch_tokens(compute_flops),
        "deepseek_lr_opt": deepseek_optimal_lr(compute_flops),
        "deepseek_source": "DeepSeek LLM (arXiv:2401.02954) eq. 1: B_opt = 0.2920 C^0.3271 tokens, "
                           "eta_opt = 0.3118 C^-0.1250, C = M D (non-embedding FLOPs/token x tokens)",
    }
