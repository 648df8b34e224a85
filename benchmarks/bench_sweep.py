"""Time a 512-point sweep of a 64-GPU config (not a pass/fail test).

    python benchmarks/bench_sweep.py               # local worker processes (all CPUs)
    python benchmarks/bench_sweep.py --workers 1   # in-process, for comparison
    python benchmarks/bench_sweep.py --out sweep.parquet

The config is Llama 3 8B on 8 DGX H100 nodes (64 GPUs), seq 4,096, 1M-token batch; the grid is
TP {1,2,4,8} x PP {1,2,4,8} (dp fills the cluster) x micro-batch {1,2} x ZeRO {0,1,2,3} x recompute
{none, full} x overlap_grad_reduce {true, false} = 512 points. Target (issue 6): <= 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import time

from simtrain.studies.sweep import sweep, write_table

CONFIG = {
    "name": "llama3-8b-64xh100-sweep", "model": "llama3-8b", "hardware": {"node": "dgx-h100", "n_nodes": 8},
    "layout": {"tp": 1, "dp": 64}, "train": {"seq_len": 4096, "global_batch_seqs": 256},
}
GRID = {"layout.tp": [1, 2, 4, 8], "layout.pp": [1, 2, 4, 8], "layout.dp": ["auto"],
        "train.micro_batch_size": [1, 2], "layout.zero_stage": [0, 1, 2, 3], "layout.recompute": ["none", "full"],
        "layout.overlap_grad_reduce": [True, False]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, help="worker processes (default: all CPUs)")
    ap.add_argument("--out", help="also write the table (.parquet/.csv)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    df = sweep(CONFIG, GRID, workers=args.workers, progress=True)
    wall = time.perf_counter() - t0
    ok = df[df["error"].isna()]
    print(f"{len(df)} points ({len(ok)} simulated, {len(df) - len(ok)} errors, {int(ok['fits'].sum())} fit) "
          f"in {wall:.1f} s = {wall / len(df) * 1e3:.0f} ms/point")
    best = ok[ok["fits"].astype(bool)].sort_values("mfu", ascending=False).head(3)
    for _, r in best.iterrows():
        print(f"  tp{r['layout.tp']} pp{r['layout.pp']} dp{r['layout.dp']} mbs{r['train.micro_batch_size']} "
              f"zero{r['layout.zero_stage']} {r['layout.recompute']}: {r['step_time_s']:.3f} s, MFU {100 * r['mfu']:.1f} %")
    if args.out:
        write_table(df, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
