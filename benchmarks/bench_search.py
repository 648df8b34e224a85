"""Time ``simtrain.studies.search`` (not a pass/fail test).

    python benchmarks/bench_search.py            # all cases
    python benchmarks/bench_search.py --quick    # only (a)

Cases:
  (a) Llama 3.1 405B on 16,384 H100 (examples/llama3_405b_h100.yaml: 16M-token batch at 8K), the full
      layout space (TP, PP, VPP, CP, DP, ZeRO 0-3, micro-batch 1-8, recompute), default top-k and
      simulation budget. Target (issue 6): <= 60 s on 2 cores.
  (b) the same without context parallelism (--cp 1).
  (c) Llama 3 70B on 256 H100 (0.5M-token batch at 4K) on the restricted space of
      tests/test_search.py: the search's best (top 4 simulated) against simulating every fitting layout.
  (d) DeepSeek-V3 on 2,048 H800 (examples/deepseek_v3_h800.yaml, 63M-token batch), MoE space restricted
      to TP 1/2, PP 8/16, micro-batch 1, ZeRO-1, selective/full recompute (every EP, ETP, CP, VPP,
      1F1B/interleaved/DualPipe), top 3 simulated.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simtrain.studies.search import SearchSpace, _point, search
from simtrain.studies.search_render import render_search
from simtrain.studies.sweep import base_data, run_points

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_405B = ROOT / "examples" / "llama3_405b_h100.yaml"
EXAMPLE_DSV3 = ROOT / "examples" / "deepseek_v3_h800.yaml"
SPACE_DSV3 = SearchSpace(tp=(1, 2), pp=(8, 16), micro_batch_size=(1,), zero_stage=(1,), recompute=("selective", "full"))
CFG_70B = {"name": "exhaustive", "model": "llama3-70b", "hardware": {"node": "dgx-h100", "n_nodes": 32},
           "layout": {"tp": 8, "pp": 4, "dp": 8}, "train": {"seq_len": 4096, "global_batch_seqs": 128}}
SPACE_70B = SearchSpace(tp=(4, 8), pp=(2, 4, 8), cp=(1,), micro_batch_size=(1,), zero_stage=(1,),
                        recompute=("none",))


def case_405b(space: SearchSpace, label: str) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    r = search(EXAMPLE_405B, gpus=16384, space=space)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # the CPU time of this process is the enumeration, pruning and estimates (simulation runs in workers):
    # on a shared machine it is steadier than the wall time
    print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU in this process ({r.n_enumerated} layouts, "
          f"{r.n_memory} over memory, {r.n_simulated} simulated)")
    print(render_search(r, 6))


def case_exhaustive() -> None:
    t0 = time.perf_counter()
    r = search(CFG_70B, space=SPACE_70B, top_k=4)
    t_search = time.perf_counter() - t0
    fitting = [c for c in r.candidates if c.status in ("best", "simulated", "estimated")]
    t0 = time.perf_counter()
    rows = run_points(base_data(CFG_70B), [_point(c) for c in fitting])
    t_all = time.perf_counter() - t0
    best = min((row for row in rows if row["error"] is None and row["fits"]), key=lambda row: row["step_time_s"])
    assert r.best is not None
    gap = 100 * (r.best.step_time_s / best["step_time_s"] - 1)
    print(f"(c) 70B/256 H100: search {t_search:.1f} s -> {r.best.label()} {r.best.step_time_s:.4f} s; exhaustive "
          f"({len(fitting)} layouts, {t_all:.1f} s) -> {best['step_time_s']:.4f} s; gap {gap:+.2f} %")


def case_moe() -> None:
    t0 = time.perf_counter()
    r = search(EXAMPLE_DSV3, space=SPACE_DSV3, top_k=3)
    wall = time.perf_counter() - t0
    print(f"(d) DeepSeek-V3/2,048 H800, restricted MoE space: {wall:.1f} s wall ({r.n_enumerated} layouts, "
          f"{r.n_memory} over memory, {r.n_simulated} simulated)")
    print(render_search(r, 6))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only case (a)")
    args = ap.parse_args(argv)
    case_405b(SearchSpace(), "(a) 405B/16,384 H100, full space")
    if args.quick:
        return 0
    case_405b(SearchSpace(cp=(1,)), "(b) 405B/16,384 H100, no CP")
    case_exhaustive()
    case_moe()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
