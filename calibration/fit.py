"""Fitted cost functions (scipy least squares) over the measurements.

Both fits minimise the squared log ratio of predicted to measured time, so every point weighs by
its relative error, whatever its size (the measurements span six decades of time):

- ``fit_curve``: ``t = a_s + x / rate`` (fixed cost + throughput; the alpha-beta model of the
  reference's Table B) for 1-D curves: memory-bound ops over bytes, attention over FLOPs,
  collectives over message size.
- ``fit_gemm``: ``t = t0_s + 2mnk / (peak_role * u(m) u(n) u(k))``, ``u(x) = x / (x + x_half)``, with
  one asymptotic peak per GEMM role and shared half-utilisation dimensions.

Residuals are reported as fractions: ``residual_rms`` = exp(rms of log ratios) - 1, ``residual_max``
= exp(max |log ratio|) - 1. ``simtrain/hardware/calibrated.py`` documents how the fits are evaluated
(measured points take precedence; the fits extrapolate).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

GEMM_ROLES = ("fwd", "dgrad", "wgrad")


def _residuals(log_ratio: np.ndarray) -> dict[str, float]:
    if log_ratio.size == 0:
        return {"residual_rms": 0.0, "residual_max": 0.0}
    return {"residual_rms": float(math.expm1(math.sqrt(float(np.mean(log_ratio ** 2))))),
            "residual_max": float(math.expm1(float(np.max(np.abs(log_ratio)))))}


def merge_points(x: Sequence[float], t_s: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted unique x with the median time of the measurements at each x."""
    groups: dict[float, list[float]] = defaultdict(list)
    for xi, ti in zip(x, t_s, strict=True):
        groups[float(xi)].append(float(ti))
    xs = sorted(groups)
    return xs, [statistics.median(groups[v]) for v in xs]


def fit_curve(x: Sequence[float], t_s: Sequence[float]) -> dict[str, Any]:
    """A curve (``simtrain.hardware.calibrated.Curve`` fields) with its affine fit and residuals.

    Args:
        x: abscissae (> 0): bytes, FLOPs or message sizes.
        t_s: measured median times, seconds (> 0).
    """
    xs, ts = merge_points(x, t_s)
    X, T = np.array(xs), np.array(ts)
    if len(xs) == 1:
        a_s, rate = 0.0, xs[0] / ts[0]
    else:
        def resid(theta: np.ndarray) -> np.ndarray:
            return np.log(np.exp(theta[0]) + X / np.exp(theta[1])) - np.log(T)

        x0 = np.array([math.log(min(ts) / 2), math.log(max(xs) / max(ts))])
        sol = _least_squares()(resid, x0, method="lm" if len(xs) > 2 else "trf")
        a_s, rate = float(math.exp(sol.x[0])), float(math.exp(sol.x[1]))
    pred = np.log(a_s + X / rate)
    return {"x": xs, "t_s": ts, "a_s": a_s, "rate": rate, "points": len(xs), **_residuals(pred - np.log(T))}


def _gemm_model(theta: np.ndarray, roles: list[str], m: np.ndarray, n: np.ndarray, k: np.ndarray,
                role_index: np.ndarray) -> np.ndarray:
    t0 = math.exp(theta[0])
    m_half, n_half, k_half = np.exp(theta[1:4])
    peaks = np.exp(theta[4:4 + len(roles)])
    util = (m / (m + m_half)) * (n / (n + n_half)) * (k / (k + k_half))
    return np.asarray(t0 + 2.0 * m * n * k / (peaks[role_index] * util))


def fit_gemm(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The GEMM model (``simtrain.hardware.calibrated.GemmModel`` fields) from rows with role, m, n, k, median_s."""
    if not rows:
        return None
    roles = [r for r in GEMM_ROLES if any(row["role"] == r for row in rows)]
    if "fwd" not in roles:
        roles.insert(0, "fwd")
    m, n, k = (np.array([float(row[c]) for row in rows]) for c in ("m", "n", "k"))
    t = np.array([float(row["median_s"]) for row in rows])
    role_index = np.array([roles.index(row["role"]) for row in rows])
    best = float(np.max(2 * m * n * k / t))
    x0 = np.array([math.log(float(t.min()) / 4), *(math.log(16.0),) * 3, *(math.log(best),) * len(roles)])
    lo = np.array([math.log(1e-9), *(0.0,) * 3, *(math.log(best / 100),) * len(roles)])
    hi = np.array([math.log(float(t.max())), *(math.log(1e6),) * 3, *(math.log(best * 100),) * len(roles)])

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.log(_gemm_model(theta, roles, m, n, k, role_index)) - np.log(t)

    sol = _least_squares()(resid, np.clip(x0, lo, hi), bounds=(lo, hi))
    th = sol.x
    return {"form": "t = t0_s + 2mnk / (peak_flops_per_s[role] * u(m) u(n) u(k)); u(x) = x / (x + x_half)",
            "t0_s": float(math.exp(th[0])), "m_half": float(math.exp(th[1])), "n_half": float(math.exp(th[2])),
            "k_half": float(math.exp(th[3])),
            "peak_flops_per_s": {r: float(math.exp(th[4 + i])) for i, r in enumerate(roles)},
            "points": len(rows), **_residuals(resid(th))}


def _least_squares() -> Any:
    """scipy's ``least_squares``, imported when a fit runs: importing scipy.optimize takes seconds, and every
    rank of the multi-process part imports this module without fitting anything."""
    from scipy.optimize import least_squares

    return least_squares
