"""The in-situ factor: a whole layer step measured in one go over the sum of its kernels measured alone.

Isolated kernel timings miss what happens between and around kernels in a real step: dispatch and
launch gaps, allocations (on a CPU, fresh pages), caches holding other data (reference Notes 3,
"Isolation vs in situ": measure those separately). The calibration times an eager Llama layer of
the target's shape whole (``compute.bench_layer_step``, forward and backward) and simtrain's own
lowering prices the same layer's kernels with the fitted functions; their ratio is the profile's
``summary.in_situ``, which simtrain applies to the layers' kernels (``simtrain.hardware.calibrated.in_layer``).
"""

from __future__ import annotations

import statistics
from typing import Any

from calibration.shapes import Target, placeholder_gpu
from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.calibrated import CalibratedCompute, in_layer
from simtrain.lower.ops import CostedComputeOp


def layer_kernels_s(target: Target, compute: CalibratedCompute) -> float:
    """Seconds of one layer's forward and backward kernels (one micro-batch) priced by ``compute``."""
    cost = ComputeCostModel(placeholder_gpu(), calibration=compute)
    lowered = lower(target.run(), cost)
    total = sum(k.time_s for op in lowered.programs[0].ops
                if isinstance(op, CostedComputeOp) and op.category in ("fwd", "bwd")
                for k in op.kernels if in_layer(k.name))
    return total / target.model.n_layers


def in_situ_factor(target: Target | None, records: list[dict[str, Any]],
                   compute: CalibratedCompute) -> dict[str, float] | None:
    """{measured_s, kernels_s, factor} from the journal's layer_step records, or None without them."""
    if target is None:
        return None
    by_pass: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for r in records:
        if r["kind"] == "layer_step" and r["status"] == "ok":
            by_pass[r["params"]["pass"]].append(r["stats"]["median_s"])
    needed = {"norm", "norm.bwd", "act", "act.bwd"}
    if not by_pass["fwd"] or not by_pass["bwd"] or compute.gemm is None or compute.attention is None \
            or not needed <= set(compute.memory_ops):
        return None  # the layer's kernels are not all calibrated: no meaningful ratio
    measured = statistics.median(by_pass["fwd"]) + statistics.median(by_pass["bwd"])
    kernels = layer_kernels_s(target, compute)
    return {"measured_s": measured, "kernels_s": kernels, "factor": measured / kernels}
