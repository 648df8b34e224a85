"""The wait for the slowest rank: synchronous ranks whose step times jitter end each step at the slowest one.

A data-parallel step ends when every rank's gradients are reduced, so it takes as long as its slowest
rank. The engine simulates every rank doing the same work in the same time; a real rank's step time
varies from step to step (on a CPU: page faults and frees, the scheduler; on a GPU: clocks and launch
gaps), independently of the other ranks'. With N ranks whose work time W has standard deviation
sigma per step, the step lasts E[max of N] = mean + sigma * e(N) (order statistics of N independent
normal draws; e(2) = 1/sqrt(pi) = 0.564, e(N) ~ sqrt(2 ln N) for large N), not the mean.

Measured on this project's CPU (issue 29 part 5, ``benchmarks/ddp_phases.py``-style runs of 30-40 steps,
two processes training apart, started together each step): the median over the steps of the slower
rank's step read +0.7 % (``l8-s128-v4k``, per-step coefficient of variation 1.8 %) and +5.3 %
(``l6-s128-v32k``, 7.6 %) above the mean of the ranks' medians; e(2) x the coefficient of variation
gives +1.0 % and +4.3 %.

``GpuSpec.step_time_cv`` is the coefficient of variation: a calibrated profile's
``summary.step_jitter.cv`` (the spread of the calibrated stack's whole training steps, timed by
``calibration.instep_measure``); 0 in the built-in GPU profiles (no public per-step jitter figure of a
GPU rank), so no prediction on them moves. Jitter is taken independent across ranks and steps and
normal; a heavy-tailed jitter (a rank's rare long stall) waits more than this.

**Work longer than the measured step.** The cv is measured on steps of ``GpuSpec.step_time_ref_s`` seconds
(``summary.step_jitter.median_s``: one micro-batch of the calibrated config), but a simulated rank's work
can span several such lengths (gradient accumulation, a pipeline's micro-batches, a larger config). The
jitter is taken to accumulate as independent increments, so its standard deviation grows with the square
root of the work, not in proportion: sigma = cv x sqrt(ref x W), which is cv x W at W = ref. The
calibration's own step series says so: over three calibrations of 33 steps (2026-12-07, this CPU; per
round over its median), the variance of sums of k = 2, 3 and 5 consecutive steps was 0.8-1.1, 0.9-2.4 and
0.4-1.9 times k x the variance of one step (mean over the three about 1.0 at k = 5), where fully
correlated steps would give k times that (5 at k = 5). With no reference length (0) the cv applies to
any work as it is (sigma = cv x W).
"""

from __future__ import annotations

import math

import numpy as np

from simtrain.hardware.hardware import GpuSpec

#: Integration grid of ``expected_max``: standard-normal quantiles from -12 to 12 in steps of 1/400 (the
#: maximum of 10^9 draws lies near 6; the trapezoid rule's error is below 1e-9 there)
_X = np.linspace(-12.0, 12.0, 9601)
_CDF = 0.5 * (1.0 + np.array([math.erf(x / math.sqrt(2.0)) for x in _X]))
_X.setflags(write=False)
_CDF.setflags(write=False)


def expected_max(n: int) -> float:
    """E[max of n independent standard normal draws] (dimensionless): 0 for n = 1, 1/sqrt(pi) for n = 2.

    E[M] = int_0^inf (1 - F(x)^n) dx - int_-inf^0 F(x)^n dx for the maximum's CDF F^n, by the trapezoid
    rule on ``_X``."""
    if n < 1:
        raise ValueError(f"expected_max needs at least one draw, got n={n}")
    if n == 1:
        return 0.0
    cdf_n = _CDF ** n
    zero = len(_X) // 2  # _X[zero] == 0: the integrand jumps by 1 there, so each side is integrated alone
    return _trapezoid(1.0 - cdf_n[zero:]) - _trapezoid(cdf_n[:zero + 1])


def _trapezoid(y: np.ndarray) -> float:
    """The trapezoid rule over ``y`` sampled at ``_X``'s spacing."""
    return float((_X[1] - _X[0]) * (y.sum() - 0.5 * (y[0] + y[-1])))


def sync_wait_s(cv: float, work_s: float, ranks: int, ref_s: float = 0.0) -> float:
    """Expected seconds a step of ``ranks`` synchronised ranks lasts beyond one rank's ``work_s`` (its
    compute and optimizer seconds), when a step of ``ref_s`` seconds has coefficient of variation ``cv``:
    ``sigma * expected_max(ranks)`` with sigma = ``cv * sqrt(ref_s * work_s)`` (independent increments:
    the module docstring), or ``cv * work_s`` when ``ref_s`` is 0; 0 without jitter or with one rank."""
    if cv <= 0.0 or ranks <= 1 or work_s <= 0.0:
        return 0.0
    sigma = cv * math.sqrt(ref_s * work_s) if ref_s > 0.0 else cv * work_s
    return sigma * expected_max(ranks)


def rank_wait_s(gpu: GpuSpec, work_s: float, ranks: int) -> float:
    """``sync_wait_s`` with ``gpu``'s measured jitter (``step_time_cv`` on steps of ``step_time_ref_s``) for a
    rank's ``work_s`` seconds of compute and optimizer over ``ranks`` ranks: what ``simulate`` and the search's
    estimate add to a step."""
    return sync_wait_s(gpu.step_time_cv, work_s, ranks, gpu.step_time_ref_s)
