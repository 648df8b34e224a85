"""Facts every simulated step must satisfy; a result breaking one is a simulator bug, not an answer.

``check`` runs on every ``simulate`` result (a few comparisons: cheap) and raises
``SimulationInvariantError`` naming the config and the numbers:

- MFU within (0, peak ratio]: model FLOP/s per GPU cannot beat the GPU's peak for the run's precision
  (MFU is against the dense BF16 peak, so FP8 and FP4 runs may reach their peak's ratio to it);
- HFU at least MFU: the kernels execute every model FLOP (recompute only adds), up to ``HFU_REL_TOL``;
- the breakdown adds up to the step time (``BREAKDOWN_REL_TOL``) with no negative part;
- memory never negative: peaks, components, the ledger's lowest total;
- each stage's closed-form peak equals the ledger's (``CLOSED_FORM_REL_TOL``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simtrain.spec.errors import SimulationInvariantError

if TYPE_CHECKING:
    from simtrain.engine.results import StepResult
    from simtrain.hardware.hardware import GpuSpec

#: HFU may fall this far below MFU: the model-FLOP formula (``simtrain.lower.flops``) and the kernels' FLOPs
#: count a few small terms differently (norms, the loss); on the examples and the published runs HFU
#: stays >= MFU.
HFU_REL_TOL = 0.02

#: The breakdown's parts add up to the step time within this fraction of it (float rounding only: the
#: ``other`` part takes the rest).
BREAKDOWN_REL_TOL = 1e-6

#: A stage's closed-form peak (``memory.closed_form_peak``) and its ledger peak agree within this
#: fraction: the closed form walks the same deltas in issue order, the ledger in time order; on the
#: examples and a sample of the published runs they agree to 1e-9 except where a comm stream's buffer
#: frees overlap compute (within 1 %).
CLOSED_FORM_REL_TOL = 0.03

#: Bytes of float rounding a ledger's running total may go below zero by.
NEGATIVE_BYTES_TOL = 1.0


def peak_ratio(gpu: GpuSpec, precision: str) -> float:
    """Highest MFU a run can reach: its precision's dense peak over the BF16 peak MFU is measured against."""
    if precision == "fp8" and gpu.fp8_flops_per_s > 0:
        return max(gpu.fp8_flops_per_s / gpu.bf16_flops_per_s, 1.0)
    if precision == "fp4" and gpu.fp4_flops_per_s > 0:
        return max(gpu.fp4_flops_per_s / gpu.bf16_flops_per_s, 1.0)
    return 1.0


def violations(r: StepResult, max_mfu: float, ledger_min_bytes: float = 0.0) -> list[str]:
    """Every invariant ``r`` breaks, each with its numbers (empty when none)."""
    out = []
    if not (math.isfinite(r.step_time_s) and r.step_time_s > 0):
        out.append(f"step time {r.step_time_s!r} s is not a positive finite number")
        return out
    if not (0.0 < r.mfu <= max_mfu * (1 + 1e-9)):
        out.append(f"MFU {r.mfu:.6g} outside (0, {max_mfu:g}] (the GPU's peak for this precision)")
    if r.hfu < r.mfu * (1 - HFU_REL_TOL):
        out.append(f"HFU {r.hfu:.6g} below MFU {r.mfu:.6g}")
    bd = r.breakdown_s
    parts = {k: v for k, v in bd.items() if k != "exposed_comm"}
    parts.update({f"exposed_comm.{k}": v for k, v in bd["exposed_comm"].items()})
    total = sum(parts.values())
    if abs(total - r.step_time_s) > BREAKDOWN_REL_TOL * r.step_time_s:
        out.append(f"breakdown adds up to {total:.9g} s, step time {r.step_time_s:.9g} s")
    neg = {k: v for k, v in parts.items() if v < -BREAKDOWN_REL_TOL * r.step_time_s}
    if neg:
        out.append(f"negative breakdown parts {neg}")
    if ledger_min_bytes < -NEGATIVE_BYTES_TOL:
        out.append(f"a memory ledger went to {ledger_min_bytes:.6g} bytes (negative)")
    for m in r.memory:
        bad = {k: v for k, v in m.components.items() if v < -NEGATIVE_BYTES_TOL}
        if m.peak_bytes < 0 or bad:
            out.append(f"stage {m.stage}: negative memory (peak {m.peak_bytes:.6g} B, components {bad})")
        if abs(m.closed_form_peak_bytes - m.peak_bytes) > CLOSED_FORM_REL_TOL * max(m.peak_bytes, 1.0):
            out.append(f"stage {m.stage}: closed-form peak {m.closed_form_peak_bytes:.6g} B vs ledger peak "
                       f"{m.peak_bytes:.6g} B (more than {CLOSED_FORM_REL_TOL:.0%} apart)")
    return out


def check(r: StepResult, gpu: GpuSpec, precision: str, ledger_min_bytes: float = 0.0) -> None:
    """Raise ``SimulationInvariantError`` when ``r`` breaks an invariant (see the module docstring)."""
    found = violations(r, peak_ratio(gpu, precision), ledger_min_bytes)
    if found:
        raise SimulationInvariantError(r.name, found)
