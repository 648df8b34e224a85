"""The convergence what-if model (simtrain.studies.convergence) and the batch what-if of simtrain.studies.run."""

from __future__ import annotations

import math
from typing import Any

import pytest
from test_run import BASE, fake_step  # the same tiny run and engine-free step

from simtrain.spec.errors import ConfigError
from simtrain.studies.convergence import (
    NoiseScaleModel,
    deepseek_optimal_batch_tokens,
    deepseek_optimal_lr,
    kaplan_critical_batch_tokens,
    noise_model,
)
from simtrain.studies.run import batch_whatif


def test_mccandlish_tradeoff() -> None:
    """S = S_min(1 + B_noise/B), E = E_min(1 + B/B_noise), E = S B; both double at B = B_noise."""
    m = NoiseScaleModel(b_noise_tokens=4e6, e_min_tokens=1e11)
    assert m.s_min_steps == pytest.approx(1e11 / 4e6)
    for b in (1e5, 4e6, 1e8):
        assert m.steps(b) * b == pytest.approx(m.tokens(b))
    assert m.steps(4e6) == pytest.approx(2 * m.s_min_steps)
    assert m.tokens(4e6) == pytest.approx(2 * m.e_min_tokens)
    assert m.steps(1e15) == pytest.approx(m.s_min_steps, rel=1e-6)
    assert m.tokens(1.0) == pytest.approx(m.e_min_tokens, rel=1e-6)


def test_published_fits() -> None:
    # Kaplan et al. 2020 eq. 1.4: B_crit = 2e8 / L^(1/0.21); DeepSeek LLM eq. 1.
    assert kaplan_critical_batch_tokens(2.0) == pytest.approx(2e8 / 2.0 ** (1 / 0.21))
    assert deepseek_optimal_batch_tokens(1e20) == pytest.approx(0.2920 * 1e20**0.3271)
    assert deepseek_optimal_lr(1e20) == pytest.approx(0.3118 * 1e20**-0.125)
    with pytest.raises(ConfigError):
        kaplan_critical_batch_tokens(0.0)


def test_anchor_reaches_the_planned_tokens() -> None:
    m, source = noise_model(anchor_batch_tokens=2e6, anchor_tokens=1e11, b_noise_tokens=8e6)
    assert source == "given"
    assert m.tokens(2e6) == pytest.approx(1e11)
    with pytest.raises(ConfigError) as err:
        noise_model(2e6, 1e11)
    assert err.value.problems[0].path == "noise_scale_tokens"


def test_batch_whatif_rows() -> None:
    data: dict[str, Any] = {**BASE, "run": {"tokens": "1Gi", "price_per_gpu_hour": 1.0}}
    rows, info = batch_whatif(data, [32 * 1024, 64 * 1024, 128 * 1024, 1000], b_noise_tokens=65536,
                              simulate_fn=fake_step)
    assert "McCandlish" in info["model"] and info["b_noise_tokens"] == 65536
    ok = [r for r in rows if r["error"] is None]
    # 1,000 tokens is not whole micro-batches (U = 1,024 x 1 x dp 8 = 8,192 tokens): rounded to one per rank,
    # and the row's steps and tokens use the batch simulated (simtrain.spec.load.round_token_batch)
    assert len(ok) == 4 and rows[3]["train.global_batch_tokens"] == 8192
    anchor = next(r for r in ok if r["train.global_batch_tokens"] == 64 * 1024)
    assert anchor["tokens_to_target"] == pytest.approx(2**30, rel=1e-3)  # the planned run reaches the target
    for r in ok:
        assert r["time_to_target_s"] == pytest.approx(r["steps_to_target"] * r["step_time_s"])
        assert r["steps_to_target"] == math.ceil(r["tokens_to_target"] / r["train.global_batch_tokens"])
    # bigger batches need fewer steps but more tokens
    assert ok[0]["steps_to_target"] > ok[1]["steps_to_target"] > ok[2]["steps_to_target"]
    assert ok[0]["tokens_to_target"] < ok[1]["tokens_to_target"] < ok[2]["tokens_to_target"]
