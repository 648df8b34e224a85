"""Timing one benchmark: warm-up, device timers, an L2 flush, the median and spread of repeats.

Practice from the reference (hardware-collectives-memory.md, Notes 3, "Microbenchmark practices"):

- time on the device: CUDA events recorded on the stream around each repetition, one synchronise
  at the end (``torch.cuda.Event``); on a CPU, ``time.perf_counter`` around the call, or with
  ``Clock.THREAD_CPU`` the CPU time of the calling thread (``time.thread_time``: user + system, so
  page faults count; the time other processes held the core does not, see :class:`Clock`);
- warm up first (cuBLAS heuristics, lazy module loading, allocator growth): ``warmup`` calls, whose
  last one also sizes the number of repetitions to about ``target_s`` of timed work;
- flush the L2 before each repetition on a GPU (a write of ``flush_bytes``, >= 2x the L2; Triton's
  ``do_bench`` zeroes 256 MB), so weights are cold as they are in training;
- report the median and the inter-quartile range of >= ``min_repeats`` repetitions; a point whose
  relative IQR exceeds ``noisy_spread`` (5-10 % in the reference) is measured again with twice the
  repetitions and the less noisy of the two is kept.

An out-of-memory error becomes :class:`OutOfMemory`, which the caller records and skips.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

import torch


class OutOfMemory(RuntimeError):
    """The benchmark's tensors did not fit in device memory."""


class Clock(StrEnum):
    """What a CPU benchmark's seconds are.

    ``WALL``: ``time.perf_counter``, elapsed time. ``THREAD_CPU``: ``time.thread_time``
    (``CLOCK_THREAD_CPUTIME_ID``), the CPU time the calling thread ran, user and system. With one
    compute thread per process (``torch.set_num_threads(1)``) every kernel runs on the calling thread,
    so on an otherwise idle core both read the same; on a machine shared with other processes the
    wall clock also counts the time the scheduler gave the core to them (on this project's 2-vCPU
    machine, 2/3 of a single-threaded step's wall time with five other users: 0.99 s of CPU in a
    3.05 s step), while the thread's CPU time does not. GPUs always use CUDA events.
    """

    WALL = "wall"
    THREAD_CPU = "thread_cpu"

    def now(self) -> float:
        """The clock's reading, seconds."""
        return time.thread_time() if self is Clock.THREAD_CPU else time.perf_counter()


@dataclass(frozen=True, slots=True)
class TimerSettings:
    """How to time one benchmark.

    Attributes:
        warmup: untimed calls before timing.
        min_repeats, max_repeats: bounds on timed repetitions.
        target_s: timed work to aim for per measurement, seconds.
        noisy_spread: relative IQR above which the point is re-measured once.
        flush_bytes: bytes written before each repetition to flush the L2 (GPU only; 0 = none).
        clock: what a CPU repetition's seconds are (:class:`Clock`; GPUs use CUDA events).
    """

    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 50
    target_s: float = 0.2
    noisy_spread: float = 0.10
    flush_bytes: int = 0
    clock: Clock = Clock.WALL

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON- and YAML-safe) for the journal header."""
        return {**asdict(self), "clock": self.clock.value}


@dataclass(frozen=True, slots=True)
class Stats:
    """Distribution of one benchmark's repetitions, seconds."""

    median_s: float
    p25_s: float
    p75_s: float
    min_s: float
    repeats: int
    remeasured: bool = False

    @property
    def spread(self) -> float:
        """Relative inter-quartile range (p75 - p25) / median."""
        return (self.p75_s - self.p25_s) / self.median_s if self.median_s > 0 else 0.0

    def to_dict(self) -> dict[str, float | int | bool]:
        """Plain dict (JSON-safe) for the journal."""
        return asdict(self)


def summarize(times_s: list[float], remeasured: bool = False) -> Stats:
    """Median, quartiles and minimum of repetition times (seconds)."""
    xs = sorted(times_s)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25, p75 = xs[0], xs[-1]
    return Stats(statistics.median(xs), p25, p75, xs[0], len(xs), remeasured)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class DeviceTimer:
    """Times callables on one device with :class:`TimerSettings`."""

    def __init__(self, device: torch.device, settings: TimerSettings):
        self.device = device
        self.settings = settings
        self.cuda = device.type == "cuda"
        self._flush = (torch.empty(settings.flush_bytes // 4, dtype=torch.float32, device=device)
                       if self.cuda and settings.flush_bytes > 0 else None)

    def sync(self) -> None:
        """Wait for the device (no-op on a CPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def measure(self, fn: Callable[[], object], setup: Callable[[], object] | None = None) -> Stats:
        """Time ``fn`` (``setup`` runs untimed before each call); re-measure once if noisy.

        Raises:
            OutOfMemory: the benchmark ran out of device memory.
        """
        try:
            per_call = self._warmup(fn, setup)
            s = self.settings
            reps = int(min(max(s.target_s / max(per_call, 1e-9), s.min_repeats), s.max_repeats))
            first = summarize(self._repeat(fn, setup, reps))
            if first.spread <= s.noisy_spread:
                return first
            second = summarize(self._repeat(fn, setup, min(2 * reps, 2 * s.max_repeats)), remeasured=True)
            return second if second.spread <= first.spread else replace(first, remeasured=True)
        except (RuntimeError, MemoryError) as exc:
            if isinstance(exc, MemoryError) or _is_oom(exc):
                if self.cuda:
                    torch.cuda.empty_cache()
                raise OutOfMemory(str(exc).splitlines()[0] if str(exc) else "out of memory") from None
            raise

    def _warmup(self, fn: Callable[[], object], setup: Callable[[], object] | None) -> float:
        last = 0.0
        for _ in range(max(self.settings.warmup, 1)):
            last = self._repeat(fn, setup, 1)[0]
        return last

    def _repeat(self, fn: Callable[[], object], setup: Callable[[], object] | None, n: int) -> list[float]:
        if self.cuda:
            return self._repeat_cuda(fn, setup, n)
        out = []
        now = self.settings.clock.now
        for _ in range(n):
            if setup is not None:
                setup()
            t0 = now()
            fn()
            out.append(now() - t0)
        return out

    def _repeat_cuda(self, fn: Callable[[], object], setup: Callable[[], object] | None, n: int) -> list[float]:
        events = []
        for _ in range(n):
            if setup is not None:
                setup()
            if self._flush is not None:
                self._flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) * 1e-3 for s, e in events]  # CUDA events report milliseconds
