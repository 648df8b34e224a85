"""Time ``simtrain.studies.simulate`` itself (not a pass/fail test).

Each case is run once as a warm-up, then three times; the median wall time (``time.perf_counter``)
is reported.

    python benchmarks/bench_simulate.py            # all cases
    python benchmarks/bench_simulate.py --quick    # only (a), the 405B example
    python benchmarks/bench_simulate.py --examples # CPU seconds of each examples/*.yaml, once each

Cases:
  (a) examples/llama3_405b_h100.yaml in symmetric mode: 16,384 GPUs, TP8 x PP16 x DP128, 16 micro-batches.
  (b) the same model and pipeline (pp=16, 16 micro-batches per step) on 16,384 GPUs vs 64 GPUs
      (tp=4, pp=16, dp=1 on 8 nodes): symmetric mode should cost about the same for both, since its
      cost grows with stages x micro-batches x layers, not with the number of GPUs.
  (c) full mode (every rank simulated) on 256 GPUs: Llama 3 8B, TP8 x PP4 x DP8 on 32 nodes, seq 4096,
      4 micro-batches per step; the same config in symmetric mode is timed beside it, and both must
      give the same step time (full mode exists to verify symmetric mode).
  (d) examples/deepseek_v3_h800.yaml: DeepSeek-V3 on 2,048 H800, DualPipe, EP64.
  (e) long gradient accumulation: the 405B example's pipeline (pp=16, vpp=4) with 384 micro-batches
      per step on 256 GPUs (dp=2), as Megatron-Bridge's GB200 405B recipe runs, with the steady-state
      shortcut (``simtrain.engine.steady``) and with every micro-batch simulated (``sim.steady_state=false``);
      both must give the same step time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simtrain import StepResult, simulate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_405B = ROOT / "examples" / "llama3_405b_h100.yaml"
EXAMPLE_DSV3 = ROOT / "examples" / "deepseek_v3_h800.yaml"

# The 405B example's model and pipeline with a long gradient accumulation: 384 micro-batches per step.
LONG_GA_405B_OVERRIDES = [
    "name=llama3.1-405b-256xh100-ga384",
    "hardware.n_nodes=32",
    "layout.dp=2",
    "train.global_batch_tokens=6291456",  # 768 sequences of 8192 = 384 micro-batches on dp=2
]

# Same model, schedule and micro-batch count as the 405B example, on 64 GPUs instead of 16,384.
SMALL_405B_OVERRIDES = [
    "name=llama3.1-405b-64xh100",
    "hardware.n_nodes=8",
    "layout.tp=4",
    "layout.dp=1",
    "train.global_batch_tokens=131072",  # 16 sequences of 8192 = 16 micro-batches on dp=1
]

FULL_256: dict[str, Any] = {
    "name": "llama3-8b-256xh100",
    "model": "llama3-8b",
    "hardware": {"node": "dgx-h100", "n_nodes": 32},
    "layout": {"tp": 8, "pp": 4, "dp": 8, "sequence_parallel": True, "zero_stage": 1},
    "train": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_seqs": 32},  # 4 micro-batches
}


def time_it(fn: Callable[[], StepResult], repeats: int = 3) -> tuple[float, StepResult]:
    """Median wall time of ``repeats`` calls after one warm-up call."""
    result = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def row(label: str, seconds: float, r: StepResult) -> str:
    return (f"{label:<34}{r.n_gpus:>7}{r.mode:>11}{r.microbatches:>6}{r.ops_executed:>11,}"
            f"{seconds:>11.3f}{r.step_time_s:>12.3f}")


def examples_cpu() -> None:
    """Each example simulated once (as ``simtrain simulate X.yaml``): its CPU seconds (``time.process_time``:
    on a shared machine wall time counts the other processes too)."""
    total = 0.0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        t0 = time.process_time()
        r = simulate(path)
        dt = time.process_time() - t0
        total += dt
        print(f"{path.stem:<34}{r.n_gpus:>7}{r.mode:>11}{r.ops_executed:>11,}{dt:>11.2f}")
    print(f"{'all examples':<34}{'':>29}{total:>11.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="run only case (a)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per case (default 3)")
    ap.add_argument("--examples", action="store_true", help="only the CPU seconds of each example, once each")
    args = ap.parse_args(argv)
    if args.examples:
        print(f"{'example':<34}{'GPUs':>7}{'mode':>11}{'ops':>11}{'CPU (s)':>11}")
        examples_cpu()
        return 0

    print(f"{'case':<34}{'GPUs':>7}{'mode':>11}{'mbs':>6}{'ops':>11}{'wall (s)':>11}{'step (s)':>12}")
    t_big, r_big = time_it(lambda: simulate(EXAMPLE_405B, mode="symmetric"), args.repeats)
    print(row("(a) 405B example, symmetric", t_big, r_big))
    if args.quick:
        return 0

    t_small, r_small = time_it(lambda: simulate(EXAMPLE_405B, SMALL_405B_OVERRIDES, mode="symmetric"), args.repeats)
    print(row("(b) 405B pp16 m16, 64 GPUs", t_small, r_small))
    print(row("(b) 405B pp16 m16, 16,384 GPUs", t_big, r_big))
    print(f"    cost ratio 16,384 / 64 GPUs: {t_big / t_small:.2f}x")

    t_full, r_full = time_it(lambda: simulate(FULL_256, mode="full"), args.repeats)
    print(row("(c) 8B tp8 pp4 dp8, full", t_full, r_full))
    t_sym, r_sym = time_it(lambda: simulate(FULL_256, mode="symmetric"), args.repeats)
    print(row("(c) 8B tp8 pp4 dp8, symmetric", t_sym, r_sym))
    rel = abs(r_full.step_time_s - r_sym.step_time_s) / r_full.step_time_s
    print(f"    full / symmetric wall time: {t_full / t_sym:.0f}x; step time difference {100 * rel:.3f} %")

    t_ds, r_ds = time_it(lambda: simulate(EXAMPLE_DSV3, mode="symmetric"), args.repeats)
    print(row("(d) DeepSeek-V3 DualPipe, EP64", t_ds, r_ds))

    t_steady, r_steady = time_it(lambda: simulate(EXAMPLE_405B, LONG_GA_405B_OVERRIDES), args.repeats)
    print(row("(e) 405B pp16 m384, steady state", t_steady, r_steady))
    every = [*LONG_GA_405B_OVERRIDES, "sim.steady_state=false"]
    t_every, r_every = time_it(lambda: simulate(EXAMPLE_405B, every), args.repeats)
    print(row("(e) 405B pp16 m384, every micro-batch", t_every, r_every))
    rel = abs(r_steady.step_time_s - r_every.step_time_s) / r_every.step_time_s
    print(f"    every micro-batch / steady state wall time: {t_every / t_steady:.1f}x; "
          f"step time difference {100 * rel:.2e} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
