"""Ultra-Scale-Playbook-style study: the best layout and its MFU for models of 1B to 70B on 1 to 64
nodes of H100, as a heatmap (Hugging Face, "The Ultra-Scale Playbook", 2025, which ran thousands of
such configurations on real clusters; here each cell is a ``simtrain.studies.search``).

    python examples/ultrascale_study.py                    # full grid (minutes)
    python examples/ultrascale_study.py --quick            # 3 models x 3 cluster sizes
    python examples/ultrascale_study.py --out study.parquet --html study.html

Every cell uses a 4M-token batch (1,024 sequences of 4,096 tokens, as the playbook's study uses ~1M to
4M) and searches TP, PP, VPP, DP, ZeRO, micro-batch and recompute (no CP at 4K context) with a small
simulation budget. The table has one row per (model, nodes): the best layout's sweep-style columns,
so ``simtrain report study.parquet --html study.html`` draws the MFU heatmap (model x GPUs).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from simtrain.spec.errors import ConfigError
from simtrain.studies.report import write_report
from simtrain.studies.search import SearchSpace, search
from simtrain.studies.sweep import to_frame, write_table

MODELS = ("gpt-1.7b", "llama2-7b", "llama3-8b", "llama2-13b", "gpt-39b", "llama3-70b")
NODES = (1, 2, 4, 8, 16, 32, 64)
QUICK = (("gpt-1.7b", "llama3-8b", "llama2-13b"), (1, 4, 16))


def best_row(model: str, nodes: int) -> dict[str, Any]:
    """The best layout of one cell as a table row (or a row with the reason none fits)."""
    spec: Any = {"preset": model, "max_position": 4096} if model.startswith("gpt") else model  # learned positions
    cfg = {"name": f"{model}-{nodes}n", "model": spec, "hardware": {"node": "dgx-h100", "n_nodes": nodes},
           "layout": {"tp": 1, "dp": nodes * 8}, "train": {"seq_len": 4096, "global_batch_seqs": 1024}}
    try:
        r = search(cfg, space=SearchSpace(cp=(1,), micro_batch_size=(1, 2)), top_k=3, budget_units=40_000)
    except ConfigError as exc:
        return {"model.name": model, "hardware.n_nodes": nodes, "n_gpus": nodes * 8, "error": str(exc)}
    if r.best is None or r.best.row is None:
        return {"model.name": model, "hardware.n_nodes": nodes, "n_gpus": nodes * 8, "fits": False,
                "error": "no simulated layout fits in memory"}
    return {**r.best.row, "reason": r.best.label()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 models x 3 cluster sizes")
    ap.add_argument("--out", default="study.parquet", help="table to write (.parquet or .csv)")
    ap.add_argument("--html", default="study.html", help="HTML report to write")
    args = ap.parse_args(argv)
    models, nodes = QUICK if args.quick else (MODELS, NODES)
    rows = []
    for m in models:
        for n in nodes:
            t0 = time.perf_counter()
            row = best_row(m, n)
            rows.append({**row, "point": len(rows)})
            mfu = row.get("mfu")
            print(f"{m:<12} {n:>3} nodes: " + (f"MFU {100 * mfu:5.1f} %  {row.get('reason')}" if mfu else
                                                  f"{row.get('error')}") + f"  ({time.perf_counter() - t0:.1f} s)")
    df = to_frame(rows)
    write_table(df, args.out)
    write_report(df, html_path=args.html, title="Best layout and MFU per model and cluster size (H100)",
                 source=f"examples/ultrascale_study.py -> {args.out}.")
    print(f"wrote {args.out} and {args.html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
