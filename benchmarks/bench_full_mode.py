"""How full mode's cost grows with the rank count: wall and CPU time per executed op, and peak memory.

GPT-3 175B (``examples/gpt3_175b_a100.yaml``: TP8, interleaved 1F1B with 2 chunks, full recompute, DGX
A100 nodes) in full mode (every rank simulated) on 8 to 1,024 GPUs: 8 GPUs is one node (TP8, no
pipeline), 64 and up keep PP8 and raise DP. Every size runs the same micro-batches per pipeline
(``--microbatches``, default 8) with every micro-batch simulated (``sim.steady_state=false``), so each
rank executes about the same ops and the time per op shows any cost per event that grows with the
ranks. Each size runs in its own process, whose peak RSS (``ru_maxrss``) is the memory figure.

Then the what-if full mode is for (issue 28 part 5): one slow GPU (``SLOW``) on 1,024 GPUs, and with
``--example`` the example as it is (1,024 GPUs, 96 micro-batches) without and with the slow GPU. A what-if
runs the step twice (unperturbed and perturbed): its times are both runs', its ops the perturbed run's.
Full mode simulates one rank per class of alike ranks (``simtrain.engine.merge``); the ops counted are
every rank's, as if each were simulated.

    python benchmarks/bench_full_mode.py                    # 8 .. 1,024 GPUs, and 1,024 with a slow GPU
    python benchmarks/bench_full_mode.py --gpus 64 256      # some sizes
    python benchmarks/bench_full_mode.py --example          # also the example as it is, and with a slow GPU

Nothing here passes or fails (see tests/ for that); prints a table and exits 0.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gpt3_175b_a100.yaml"
SIZES = (8, 64, 128, 256, 512, 1024)
#: The what-if: one GPU (rank 77: node 9, GPU 5) at 85 % speed.
SLOW = 'whatif.slow_gpus={"node9/gpu5": 0.85}'


def overrides(gpus: int, microbatches: int) -> list[str]:
    """``--set`` overrides of the example for ``gpus`` GPUs (8, or a multiple of 64) and the micro-batches."""
    if gpus == 8:
        return ["hardware.n_nodes=1", "layout.pp=1", "layout.vpp=1", "layout.dp=1",
                f"train.global_batch_seqs={microbatches}", "sim.steady_state=false"]
    if gpus % 64:
        raise SystemExit(f"--gpus: {gpus} is neither 8 nor a multiple of 64 (TP8 x PP8 x DP)")
    dp = gpus // 64
    return [f"hardware.n_nodes={gpus // 8}", f"layout.dp={dp}", f"train.global_batch_seqs={microbatches * dp}",
            "sim.steady_state=false"]


def _child(args: list[str]) -> None:
    """Run one simulation (this process) and print its figures as one JSON line."""
    from simtrain.studies.simulate import simulate

    ov = json.loads(args[0])
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(str(EXAMPLE), ov, mode="full")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "ops": res.ops_executed, "rss_mib": rss,
                      "step_s": res.step_time_s}))


def run(label: str, ov: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(ov)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"| {label} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | {row['ops']:,} | "
          f"{1e6 * row['wall_s'] / row['ops']:.1f} | {1e6 * row['cpu_s'] / row['ops']:.1f} | {row['rss_mib']:.0f} | "
          f"{row['step_s']:.4f} |", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="*", default=list(SIZES))
    ap.add_argument("--microbatches", type=int, default=8, help="micro-batches per pipeline (default 8)")
    ap.add_argument("--example", action="store_true", help="also the example unchanged (1,024 GPUs, 96 micro-batches)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        _child([a.child])
        return
    print("| GPUs | wall s | CPU s | ops | wall us/op | CPU us/op | peak RSS MiB | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for g in a.gpus:
        run(str(g), overrides(g, a.microbatches))
    if 1024 in a.gpus:
        run("1024, one slow GPU (what-if: 2 runs)", [*overrides(1024, a.microbatches), SLOW])
    if a.example:
        run("1024 (example, 96 mb)", [])
        run("1024 (example, 96 mb), one slow GPU (what-if: 2 runs)", [SLOW])


if __name__ == "__main__":
    main()
