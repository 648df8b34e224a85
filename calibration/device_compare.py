"""The device check's out-of-sample half: the real step against simtrain's *shipped* profile of the GPU, kernel by kernel.

The calibrated prediction (``calibration.device_check``) says whether simtrain's engine adds the measured kernels
up right. Whether simtrain is right on a GPU it was never calibrated on is the question issue 29 asks, and the
shipped profile answers it: the same run config on the built-in profile of the device's GPU
(``simtrain.validation.csv_cells.parse_gpu`` of the CUDA device name, one GPU of its node), and each kernel's
time under the shipped roofline next to its time in the calibration (measured on this device, in place), so a
difference in the step can be traced to the kernels it comes from (GEMMs, attention, memory-bound ops, the
loss, the optimizer).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.hardware.profile import compute_calibration
from simtrain.lower.ops import CostedComputeOp
from simtrain.plan.load import load_config
from simtrain.spec.config import RunConfig
from simtrain.studies.simulate import cluster_of
from simtrain.validation.csv_cells import parse_gpu


def shipped_hardware(device_name: str) -> tuple[dict[str, Any], str | None]:
    """The ``hardware`` section that puts a run on one GPU of the shipped profile of CUDA device ``device_name``,
    and the note of the mapping (None when the name maps to its own profile)."""
    gpu, node, note = parse_gpu(device_name)
    return {"gpu": gpu, "node": node, "gpus_per_node": 1}, note


def _cost_model(run: RunConfig) -> ComputeCostModel:
    """The cost source ``simulate`` builds for ``run`` (its calibration when the run names a profile)."""
    gpu = cluster_of(run).gpu
    return ComputeCostModel(gpu, run.train.precision, calibration=compute_calibration(gpu),
                            stack=run.train.stack_spec, fp8_recipe=run.train.fp8_recipe)


def kernel_seconds(run: RunConfig) -> dict[str, float]:
    """Seconds per step of each kernel name (layer numbers folded: ``ln#``) on the first pipeline stage of ``run``
    as simtrain costs it, host stalls left out (they are the engine's, not the kernel's)."""
    lowered = lower(run, _cost_model(run))
    out: dict[str, float] = defaultdict(float)
    for op in lowered.programs[0].ops:
        if isinstance(op, CostedComputeOp):
            for k in op.kernels:
                out[re.sub(r"\d+", "#", k.name)] += k.time_s
    return dict(out)


def per_kernel(calibrated: dict[str, Any], shipped: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{kernel, calibrated_s, shipped_s, ratio}`` (ratio = shipped / calibrated: below 1, the shipped
    profile is faster than this device measured) for the union of both configs' kernels, longest first."""
    cal, shp = kernel_seconds(load_config(calibrated)), kernel_seconds(load_config(shipped))
    rows = []
    for name in set(cal) | set(shp):
        c, s = cal.get(name, 0.0), shp.get(name, 0.0)
        rows.append({"kernel": name, "calibrated_s": c, "shipped_s": s, "ratio": s / c if c > 0 else None})
    return sorted(rows, key=lambda r: (-max(r["calibrated_s"], r["shipped_s"]), r["kernel"]))


def shipped_gemm_tflops(gpu: str, n: int) -> float:
    """The shipped profile ``gpu``'s modelled rate (TFLOP/s) of one BF16 ``n`` x ``n`` x ``n`` GEMM."""
    k = ComputeCostModel(load_gpu(gpu)).gemm("mlp_up", n, n, n)
    return k.flops / k.time_s / 1e12
