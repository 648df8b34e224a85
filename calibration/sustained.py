"""A GEMM's sustained rate against its burst rate, and the GPU's clocks while it runs (issue 29 part 2).

The shipped GPU profiles take a GEMM's rate from a short benchmark: a MAMF best-of-100 per shape x 0.948, the
typical / best ratio measured on an A100 (``h100-sxm.yaml`` ``gemm_efficiency``). A training run holds the GPU at
its power cap for hours, and a die at its working temperature leaks more power than a cool one, so the clock a
power-capped GPU sustains can sit below the one a benchmark of a few hundred milliseconds sees (reference
hardware-collectives-memory.md sec. 3, "Clocks and power": calibrate with a sustained run long enough to reach
thermal steady state). ``sustained_gemm`` measures that on the device itself: one randn GEMM shape back to back for
``seconds``, timed in windows by CUDA events without a host sync between them (the GPU never idles), while
``SmiSampler`` reads nvidia-smi's SM clock, power and temperature in the background. Its ``ratio`` (the last
quarter's median rate over the first window's) is the number the profiles' 0.948 stands in for.

On a CPU (the device check's dry run) the same loop runs with the thread's wall clock and no samples.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import torch

#: nvidia-smi fields sampled while the GPU works (names as ``--query-gpu`` takes them).
SMI_FIELDS = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu")
#: Seconds between nvidia-smi samples (its ``-lms`` loop).
SMI_PERIOD_S = 0.2


@dataclass(frozen=True, slots=True)
class Sample:
    """One nvidia-smi reading: wall time (s since the epoch), SM clock (MHz), board power (W), die temperature
    (C); a field the driver did not report ("[N/A]") is None."""

    t: float
    sm_mhz: float | None
    power_w: float | None
    temp_c: float | None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _parse(line: str) -> Sample | None:
    """A ``SMI_FIELDS`` csv line (``--format=csv,noheader,nounits``) as a Sample; None for a line without a
    readable timestamp or with no readable field."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(SMI_FIELDS):
        return None
    try:
        t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:  # a driver's other format
        return None
    values = [_number(p) for p in parts[1:]]
    return None if all(v is None for v in values) else Sample(t, *values)


@dataclass
class SmiSampler:
    """nvidia-smi's readings of GPU ``index`` every ``SMI_PERIOD_S`` while the context is open (none without
    nvidia-smi); ``between(t0, t1)`` summarises a time window of them."""

    index: int = 0
    samples: list[Sample] = field(default_factory=list)
    _proc: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None

    def __enter__(self) -> SmiSampler:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        try:
            self._proc = subprocess.Popen([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits",
                                           f"--loop-ms={int(SMI_PERIOD_S * 1000)}", "-i", str(self.index)],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if (s := _parse(line)) is not None:
                self.samples.append(s)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def between(self, t0: float, t1: float) -> dict[str, float] | None:
        """Median SM clock (MHz), power (W) and temperature (C) of the samples in wall-time window [t0, t1]
        (a field no sample reported is left out), and their count; None when there are none."""
        inside = [s for s in self.samples if t0 <= s.t <= t1]
        if not inside:
            return None
        out = {"samples": float(len(inside))}
        for key in ("sm_mhz", "power_w", "temp_c"):
            if values := [v for s in inside if (v := getattr(s, key)) is not None]:
                out[key] = statistics.median(values)
        return out


@dataclass(frozen=True, slots=True)
class Window:
    """One timed window of back-to-back GEMMs: its end (s after the loop began), rate (TFLOP/s), the GPU's clocks
    in it (None without samples) and its GEMM count."""

    end_s: float
    tflops: float
    clocks: dict[str, float] | None = None
    gemms: int = 0


def _windows_cuda(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, seconds: float, window_s: float
                  ) -> tuple[float, list[tuple[float, float, int]]]:
    """Enqueue windows of GEMMs (as many as one timed call says fill ``window_s``) until ``seconds`` of them have
    run by the GPU's clock, with an event between windows and no host sync; (wall time at the first event,
    [(end s, seconds, GEMMs) per window])."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    per_window = max(1, int(window_s / max(time.perf_counter() - t, 1e-9)))
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True)]
    t_wall0 = time.time()
    events[0].record()
    queued_s = 0.0
    while queued_s < seconds:
        for _ in range(per_window):
            torch.mm(a, b, out=out)
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        events.append(ev)
        # the CPU runs ahead of the GPU by at most the launch queue; read the clock of a window already done
        if len(events) > 4:
            events[-4].synchronize()
            queued_s = events[0].elapsed_time(events[-4]) * 1e-3
    torch.cuda.synchronize()
    ends = [events[0].elapsed_time(e) * 1e-3 for e in events[1:]]
    starts = [0.0, *ends[:-1]]
    return t_wall0, [(e, e - s, per_window) for s, e in zip(starts, ends, strict=True)]


def _windows_cpu(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, seconds: float, window_s: float
                 ) -> tuple[float, list[tuple[float, float, int]]]:
    """The CPU counterpart of ``_windows_cuda``: each window runs GEMMs until ``window_s`` of wall time has passed
    (a shared CPU's speed changes between windows, so a count fixed in advance would not fill them)."""
    t_wall0 = time.time()
    t0 = time.perf_counter()
    res: list[tuple[float, float, int]] = []
    while not res or res[-1][0] < seconds:
        w0 = w1 = time.perf_counter()
        count = 0
        while count == 0 or w1 - w0 < window_s:
            torch.mm(a, b, out=out)
            count += 1
            w1 = time.perf_counter()
        res.append((w1 - t0, w1 - w0, count))
    return t_wall0, res


def sustained_gemm(device: torch.device, dtype: torch.dtype, n: int, seconds: float, window_s: float = 0.5,
                   sampler: SmiSampler | None = None, seed: int = 0) -> dict[str, Any]:
    """An ``n`` x ``n`` x ``n`` GEMM of randn ``dtype`` operands back to back on ``device`` for about
    ``seconds``, in windows of about ``window_s``: each window's rate (TFLOP/s) and, with a ``sampler``
    running, the GPU's median clock, power and temperature in it.

    Returns ``{"n", "dtype", "seconds", "windows": [...], "burst_tflops"`` (the first window's, after a
    one-window warm-up that is not counted), ``"sustained_tflops"`` (median of the last quarter's windows),
    ``"ratio"`` (sustained / burst), ``"burst_clocks"`` and ``"sustained_clocks"`` (None without samples)}.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype, device=device)
    flops = 2.0 * n**3
    torch.mm(a, b, out=out)  # one call: library handles and the kernel choice
    run = _windows_cuda if device.type == "cuda" else _windows_cpu
    t_wall0, raw = run(a, b, out, seconds + window_s, window_s)
    windows = []
    for end, dur, count in raw:
        clocks = sampler.between(t_wall0 + end - dur, t_wall0 + end) if sampler is not None else None
        windows.append(Window(end, count * flops / dur / 1e12, clocks, count))
    timed = windows[1:] or windows  # the first window warms the GPU up (clocks ramp from idle)
    tail = timed[-max(1, len(timed) // 4):]
    burst = timed[0].tflops
    sustained = statistics.median(w.tflops for w in tail)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "seconds": windows[-1].end_s,
            "windows": [asdict(w) for w in windows], "burst_tflops": burst,
            "sustained_tflops": sustained, "ratio": sustained / burst, "max_tflops": max(w.tflops for w in timed),
            "burst_clocks": timed[0].clocks, "sustained_clocks": _median_clocks([w.clocks for w in tail])}


def _median_clocks(clocks: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Per field, the median over the windows that have samples; None when none has."""
    have = [c for c in clocks if c]
    if not have:
        return None
    return {k: statistics.median(c[k] for c in have if k in c) for k in ("sm_mhz", "power_w", "temp_c")
            if any(k in c for c in have)}
