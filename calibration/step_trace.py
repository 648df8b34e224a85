"""The real step seen from inside: a torch.profiler trace of the device check's training step, and how much of
the step the device was busy.

simtrain's host model (``simtrain.cost.host``) says a GPU idles while the CPU issues short kernels and after each
host synchronisation; the calibration measures kernels in isolation (reference hardware-collectives-memory.md
sec. 3, "Isolation vs in situ": per-op timings in isolation miss launch gaps). This profiles two more steps of the
same model and batch as ``calibration.realstep.train_steps`` times, writes the Chrome trace, and reports per step
the device's busy time (the union of its kernels' intervals), the idle rest of the step, the kernel count, and the
kernels that took the most time, so the in-situ kernel times and the host gaps of a real step can be set beside
simtrain's (issue 29: host and launch gaps, kernels in situ). On a CPU (the device check's dry run) the same code
runs over the main thread's top-level aten ops, the forward's: a rehearsal of the code path, not a measurement.
"""

from __future__ import annotations

import gzip
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler_util import EventList, FunctionEvent
from torch.profiler import ProfilerActivity, profile

from calibration.realstep import build_model, step_loss
from simtrain.engine.trace import write_atomic
from simtrain.spec.model import ModelSpec

#: Kernels listed by their total time.
TOP_KERNELS = 15


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals (seconds)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _kernels(events: EventList, cuda: bool) -> list[FunctionEvent]:
    """The device's kernels (CUDA) or, on a CPU, the top-level aten ops of the main thread."""
    if cuda:
        return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e for e in events if e.cpu_parent is None and e.name.startswith("aten::")]


def trace_steps(spec: ModelSpec, seq_len: int, micro_batch_size: int, device: torch.device, dtype: torch.dtype,
                out: Path, steps: int = 2, warmup: int = 2) -> dict[str, Any]:
    """Profile ``steps`` training steps (after ``warmup`` untraced ones) of ``spec`` at ``seq_len`` x
    ``micro_batch_size`` on ``device``; the Chrome trace goes to ``out`` with the suffix ``.json.gz``. Returns
    ``{"steps", "step_s", "busy_s", "idle_s", "idle_fraction", "kernels_per_step", "top_kernels": [{name,
    seconds_per_step, calls_per_step}], "trace"}`` (seconds per step, averaged over the traced steps, which run
    back to back under the profiler, so its overhead is in ``step_s``)."""
    torch.manual_seed(4321)
    model, _ = build_model(spec, dtype, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, spec.vocab, (micro_batch_size, seq_len), device=device)
    cuda = device.type == "cuda"

    def step() -> None:
        step_loss(model, ids).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
    kernels = _kernels(prof.events(), cuda)
    if not kernels:
        raise RuntimeError("the profiler recorded no kernels")
    # the steps run back to back (each ends with a sync): the device's busy time over all of them, per step
    step_s = wall / steps
    busy = min(busy_seconds([(k.time_range.start * 1e-6, k.time_range.end * 1e-6) for k in kernels]) / steps, step_s)
    by_name: dict[str, list[float]] = defaultdict(list)
    for k in kernels:
        by_name[k.name].append(k.time_range.elapsed_us() * 1e-6)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    trace = out.with_suffix(".json.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".tmp.json")
    prof.export_chrome_trace(str(raw))
    write_atomic(trace, gzip.compress(raw.read_bytes(), mtime=0))
    raw.unlink()
    return {"steps": steps, "step_s": step_s, "busy_s": busy, "idle_s": step_s - busy,
            "idle_fraction": (step_s - busy) / step_s, "kernels_per_step": len(kernels) / steps,
            "top_kernels": [{"name": n[:120], "seconds_per_step": sum(v) / steps, "calls_per_step": len(v) / steps}
                            for n, v in top],
            "trace": str(trace)}

