"""How far the search's evaluator (``simtrain.engine.probe`` through ``simtrain.studies.estimate``) or the
critical-path evaluator (``simtrain.engine.critical_path``) is from the engine (not a test).

    python benchmarks/evaluator_vs_engine.py                # every case, CSV to /tmp/evaluator_vs_engine.csv
    python benchmarks/evaluator_vs_engine.py --per-case 10  # fewer layouts per case
    python benchmarks/evaluator_vs_engine.py --evaluator critical-path  # the whole-program evaluator
    python benchmarks/evaluator_vs_engine.py --engine-csv OLD.csv  # reuse an earlier CSV's engine steps
    python benchmarks/evaluator_vs_engine.py --speed        # only the speed of one GPT-3 175B layout

The critical-path evaluator times the same lowered program as the engine (both with the steady-state
shortcut); the search's evaluator one micro-batch per (stage, chunk) of it, the pipeline from the
schedule's action lists. The layouts are the search's own
(``simtrain.studies.search_space.enumerate_layouts``) over tp/pp/vpp/zero/recompute and, for MoE models,
ep/schedule grids, taken at an even stride so each case keeps ``--per-case`` of them. Reported per
case and overall: the median, p90 and max of |critical path / engine - 1|, and the worst layouts with
the breakdown component that moved most between the two (the cause: compute stretched by collectives
in flight, or exposed communication of an axis from flow contention).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path
from typing import Any

from simtrain.engine.critical_path import _Setup, evaluate_run
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError, InfeasibleLayout
from simtrain.studies.estimate import Estimate, Estimator
from simtrain.studies.search_space import SearchSpace, enumerate_layouts
from simtrain.studies.simulate import cluster_of, simulate

ROOT = Path(__file__).resolve().parent.parent

#: (name, config, search space): dense and MoE models on A100, H100, H800 and B200 nodes.
CASES: list[tuple[str, dict[str, Any], SearchSpace]] = [
    ("gpt3-175b/256xA100", {"model": {"preset": "gpt3-175b", "vocab": 51200}, "hardware": {"node": "dgx-a100", "n_nodes": 32},
                            "train": {"seq_len": 2048, "global_batch_seqs": 256}},
     SearchSpace(tp=(4, 8), pp=(4, 8, 16), cp=(1,), micro_batch_size=(1, 2), zero_stage=(0, 1), recompute=("none", "full"))),
    ("llama3-70b/256xH100", {"model": "llama3-70b", "hardware": {"node": "dgx-h100", "n_nodes": 32},
                             "train": {"seq_len": 4096, "global_batch_seqs": 128}},
     SearchSpace(tp=(2, 4, 8), pp=(2, 4, 8), cp=(1, 2), micro_batch_size=(1,), zero_stage=(1, 3),
                 recompute=("none", "full"))),
    ("llama3-70b/128xB200", {"model": "llama3-70b", "hardware": {"node": "dgx-b200", "n_nodes": 16},
                             "train": {"seq_len": 8192, "global_batch_seqs": 64}},
     SearchSpace(tp=(2, 4, 8), pp=(1, 2, 4, 8), cp=(1,), micro_batch_size=(1,), zero_stage=(1, 2),
                 recompute=("none", "full"))),
    ("mixtral-8x7b/64xH100", {"model": "mixtral-8x7b", "hardware": {"node": "dgx-h100", "n_nodes": 8},
                              "train": {"seq_len": 4096, "global_batch_seqs": 128}},
     SearchSpace(tp=(1, 2, 4), pp=(1, 2, 4), cp=(1,), micro_batch_size=(1,), zero_stage=(1,),
                 recompute=("none", "full"))),
    ("qwen3-30b-a3b/64xH800", {"model": "qwen3-30b-a3b", "hardware": {"node": "hgx-h800", "n_nodes": 8},
                               "train": {"seq_len": 4096, "global_batch_seqs": 128}},
     SearchSpace(tp=(1, 2), pp=(1, 2, 4), cp=(1,), micro_batch_size=(1,), zero_stage=(1,),
                 recompute=("none", "full"))),
    ("mixtral-8x22b/256xH100", {"model": "mixtral-8x22b", "hardware": {"node": "dgx-h100", "n_nodes": 32},
                                "train": {"seq_len": 4096, "global_batch_seqs": 256}},
     SearchSpace(tp=(2, 4), pp=(4, 8), cp=(1,), micro_batch_size=(1,), zero_stage=(1,), recompute=("full",))),
]

GPT3_4096 = {"model": {"preset": "gpt3-175b", "vocab": 51200}, "hardware": {"node": "dgx-a100", "n_nodes": 512},
             "layout": {"tp": 8, "pp": 16, "dp": 32, "vpp": 2, "recompute": "full"},
             "train": {"seq_len": 2048, "global_batch_seqs": 1536, "micro_batch_size": 1}}


def _base(cfg: dict[str, Any]) -> dict[str, Any]:
    """The case's config with a plain data-parallel layout filling the cluster (its degrees are searched)."""
    hw = cfg["hardware"]
    gpn = 4 if hw["node"].startswith("gb") else 8
    return {**cfg, "name": "cmp", "layout": {"tp": gpn, "dp": hw["n_nodes"], "sequence_parallel": True}}


def _layouts(cfg: dict[str, Any], space: SearchSpace, n: int) -> list[dict[str, Any]]:
    run = load_config(_base(cfg))
    all_ = enumerate_layouts(run, cluster_of(run).n_gpus, space)
    stride = max(1, len(all_) // n)
    out = []
    for lay, train in all_[::stride][:n]:
        layout = lay.model_dump(mode="json", exclude_none=True)
        out.append({**cfg, "name": "cmp", "layout": layout,
                    "train": {**cfg["train"], "micro_batch_size": train.micro_batch_size}})
    return out


def _cause(cp: dict[str, Any], eng: dict[str, Any]) -> str:
    """The breakdown component that moved most from the evaluator to the engine."""
    diffs = {"compute (collectives in flight stretch it)": eng["compute"] - cp["compute"],
             "bubble": eng["bubble"] + eng.get("stage_imbalance", 0.0) - cp["bubble"],
             "optimizer": eng["optimizer"] - cp["optimizer"]}
    for axis, t in eng["exposed_comm"].items():
        diffs[f"exposed {axis} comm (contention)"] = t - cp["exposed_comm"].get(axis, 0.0)
    name = max(diffs, key=lambda k: abs(diffs[k]))
    return f"{name} {diffs[name]:+.4g} s"


FIELDS = ["case", "layout", "cp_step_s", "engine_step_s", "rel", "peak_rel", "cp_s", "engine_s", "cause", "error"]


def _search_breakdown(e: Estimate) -> dict[str, Any]:
    """An ``Estimate``'s components in ``StepResult.breakdown_s``'s shape (for ``_cause``)."""
    return {"compute": e.compute_s, "bubble": e.bubble_s, "optimizer": e.optimizer_s,
            "exposed_comm": {"tp": e.tp_s, "ep": e.ep_s, "dp": e.dp_s, "pp": e.pp_s}}


class _Search:
    """The search's evaluator, one ``Estimator`` per (model, cluster) as a search keeps (its caches)."""

    def __init__(self) -> None:
        self.estimators: dict[str, Estimator] = {}

    def __call__(self, c: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
        """(step s, peak bytes with fragmentation, breakdown) of config ``c``."""
        run = load_config(c)
        key = json.dumps([c["model"], c["hardware"]], sort_keys=True)
        est = self.estimators.get(key)
        if est is None:
            est = self.estimators[key] = Estimator(run.model, cluster_of(run), run.sim.fragmentation_ratio)
        e = est.estimate(run.layout, run.train)
        return e.step_time_s, e.peak_bytes, _search_breakdown(e)


def _critical_path(c: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    cp = evaluate_run(c)
    return cp.step_time_s, cp.peak_bytes * (1 + 0.05), cp.breakdown_s()


def compare(per_case: int, out_csv: Path, evaluator: str = "search", engine_csv: Path | None = None) -> None:
    """Compare every case's layouts, a CSV row each as it is done, then summarise. ``engine_csv``: take
    the engine's step of a layout from an earlier CSV of this script where it has one."""
    known = {(r["case"], r["layout"]): r for r in _read(engine_csv) if not r["error"]} if engine_csv else {}
    ev = _Search() if evaluator == "search" else _critical_path
    rows = []
    with out_csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for case, cfg, space in CASES:
            t_case = time.perf_counter()
            for c in _layouts(cfg, space, per_case):
                row = _compare_one(case, c, ev, known.get((case, _label(c))))
                rows.append(row)
                w.writerow(row)
                f.flush()
            print(f"{case}: {time.perf_counter() - t_case:.0f} s", flush=True)
    summarise(rows)


def _compare_one(case: str, c: dict[str, Any], ev: Any, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """One layout: the evaluator ``ev`` (config -> step, peak, breakdown) against the engine (``known``:
    an earlier row with the engine's step, whose simulation is then not repeated)."""
    try:
        t0 = time.perf_counter()
        step, peak_b, brk = ev(c)
        t1 = time.perf_counter()
        if known is None:
            eng = simulate(c)
            eng_step, eng_peak, eng_brk = eng.step_time_s, max(m.peak_bytes for m in eng.memory), eng.breakdown_s
        else:
            eng_step, eng_peak, eng_brk = float(known["engine_step_s"]), float("nan"), None
        t2 = time.perf_counter()
    except (ConfigError, InfeasibleLayout, ValueError) as e:
        return {"case": case, "layout": _label(c), "error": str(e).splitlines()[0][:80]}
    ratio = step / eng_step - 1
    peak = peak_b / eng_peak - 1  # nan where the engine's step came from an earlier CSV
    eng_s = t2 - t1 if known is None else float(known["engine_s"])
    print(f"{case:24s} {_label(c):50s} {ratio:+.4%} peak {peak:+.2e}  evaluator {t1 - t0:.3f} s  "
          f"engine {eng_s:.2f} s", flush=True)
    return {"case": case, "layout": _label(c), "cp_step_s": step, "engine_step_s": eng_step,
            "rel": ratio, "peak_rel": peak, "cp_s": t1 - t0, "engine_s": eng_s,
            "cause": _cause(brk, eng_brk) if eng_brk is not None else known["cause"] if known else "", "error": ""}


def _read(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open() as f:
        for r in csv.DictReader(f):
            for k in ("cp_step_s", "engine_step_s", "rel", "peak_rel", "cp_s", "engine_s"):
                if r[k]:
                    r[k] = float(r[k])  # type: ignore[assignment]
            rows.append(r)
    return rows


def _label(c: dict[str, Any]) -> str:
    lay = c["layout"]
    keys = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "zero_stage", "recompute", "schedule")
    short = {"zero_stage": "z", "recompute": "rc", "schedule": "s"}
    return " ".join(f"{short.get(k, k)}{lay[k]}" for k in keys if k in lay and lay[k] not in (None, "auto")) + \
        f" mbs{c['train']['micro_batch_size']}"


def _stats(xs: list[float]) -> str:
    xs = sorted(abs(x) for x in xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return f"median {statistics.median(xs):.3%}, p90 {p90:.3%}, max {xs[-1]:.3%} (n={len(xs)})"


def _tau(rows: list[dict[str, Any]]) -> float:
    """Kendall's tau between the evaluator's and the engine's step times (1: the same order)."""
    agree = disagree = 0
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            x = (a["cp_step_s"] - b["cp_step_s"]) * (a["engine_step_s"] - b["engine_step_s"])
            agree, disagree = agree + (x > 0), disagree + (x < 0)
    return (agree - disagree) / max(agree + disagree, 1)


def summarise(rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if not r["error"]]
    print(f"\n{len(ok)} layouts compared, {len(rows) - len(ok)} refused by both evaluators' lowering")
    for case in dict.fromkeys(r["case"] for r in ok):
        mine = [r for r in ok if r["case"] == case]
        print(f"  {case:24s} step {_stats([r['rel'] for r in mine])}; "
              f"evaluator {statistics.median(r['cp_s'] for r in mine):.2f} s vs engine "
              f"{statistics.median(r['engine_s'] for r in mine):.2f} s (median)")
    peaks = [r["peak_rel"] for r in ok if r["peak_rel"] == r["peak_rel"]]
    print(f"  all: step {_stats([r['rel'] for r in ok])}" + (f"; peak memory {_stats(peaks)}" if peaks else ""))
    z3 = [r for r in ok if " z3 " in r["layout"]]
    if z3:
        print(f"  ZeRO-3 only: {_stats([r['rel'] for r in z3])}; all but ZeRO-3: "
              f"{_stats([r['rel'] for r in ok if r not in z3])}")
    print(f"  time: evaluator {sum(r['cp_s'] for r in ok):.0f} s, engine {sum(r['engine_s'] for r in ok):.0f} s")
    print("ranking (per case: the engine's best, the evaluator's best and the engine's step for it, Kendall's tau):")
    for case in dict.fromkeys(r["case"] for r in ok):
        mine = [r for r in ok if r["case"] == case]
        by_eng = min(mine, key=lambda r: r["engine_step_s"])
        by_cp = min(mine, key=lambda r: r["cp_step_s"])
        print(f"  {case:24s} engine {by_eng['layout']}; evaluator {by_cp['layout']} "
              f"({by_cp['engine_step_s'] / by_eng['engine_step_s'] - 1:+.2%}); tau {_tau(mine):.3f}")
    below = sum(1 for r in ok if r["rel"] <= 1e-9)
    print(f"  critical path <= engine on {below} of {len(ok)}")
    print("worst:")
    for r in sorted(ok, key=lambda r: -abs(r["rel"]))[:8]:
        print(f"  {r['case']:24s} {r['layout']:50s} {r['rel']:+.3%}  {r['cause']}")


def speed(repeat: int) -> None:
    """GPT-3 175B on 4,096 A100: one layout from the config, and from the costed program."""
    import cProfile
    import pstats

    run = load_config({**GPT3_4096, "name": "gpt3-4096"})
    t0 = time.perf_counter()
    res = evaluate_run(run)
    t_cfg = time.perf_counter() - t0
    setup = _Setup.of(run)
    low = setup.lowered(run)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        full = setup.evaluate(low)
        best = min(best, time.perf_counter() - t0)
    t0 = time.perf_counter()
    setup.lowered(run)
    t_lower = time.perf_counter() - t0
    n_ops = sum(len(p.ops) for p in low.programs)
    print(f"GPT-3 175B / 4,096 A100 (tp8 pp16 vpp2 dp32, 48 micro-batches): from config {t_cfg * 1e3:.0f} ms "
          f"({res.note}); lowering every micro-batch {t_lower * 1e3:.0f} ms; evaluating that costed program "
          f"({n_ops:,} ops) {best * 1e3:.0f} ms; step {full.step_time_s:.4f} s")
    est = Estimator(run.model, setup.cluster, run.sim.fragmentation_ratio)
    t0 = time.perf_counter()
    e = est.estimate(run.layout, run.train)
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    est.estimate(run.layout.model_copy(update={"zero_stage": 0}), run.train)
    t_warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    est.estimate(run.layout.model_copy(update={"zero_stage": 1}), run.train)
    t_warm2 = time.perf_counter() - t0
    print(f"the search's evaluator (simtrain.engine.probe): {t_cold * 1e3:.0f} ms for the first layout from the "
          f"config, {t_warm * 1e3:.1f} / {t_warm2 * 1e3:.1f} ms for two more sharing its layer plans and groups; "
          f"step {e.step_time_s:.4f} s")
    prof = cProfile.Profile()
    prof.enable()
    setup.evaluate(low)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(8)


def examples(engine_json: Path | None) -> None:
    """Every example config: the evaluator's step against the engine's (``simulate``, or the
    ``simtrain simulate --json`` outputs in ``engine_json``, one ``NAME.json`` per example)."""
    rels = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        t0 = time.perf_counter()
        cp = evaluate_run(path)
        t_cp = time.perf_counter() - t0
        if engine_json is not None:
            eng = json.loads((engine_json / f"{path.stem}.json").read_text())
            step, peak = eng["step_time_s"], max(m["peak_bytes"] for m in eng["memory"])
        else:
            res = simulate(path)
            step, peak = res.step_time_s, max(m.peak_bytes for m in res.memory)
        frag = load_config(path).sim.fragmentation_ratio
        rel = cp.step_time_s / step - 1
        rels.append(rel)
        print(f"{path.stem:28s} critical path {cp.step_time_s:9.4f} s  engine {step:9.4f} s  {rel:+.3%}  "
              f"peak {cp.peak_bytes * (1 + frag) / peak - 1:+.1e}  ({t_cp:.2f} s; {cp.note})", flush=True)
    print(f"examples: step {_stats(rels)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-case", type=int, default=50)
    ap.add_argument("--csv", type=Path, default=Path("/tmp/evaluator_vs_engine.csv"))
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--examples", action="store_true", help="compare on examples/*.yaml")
    ap.add_argument("--engine-json", type=Path, help="with --examples: the engine's --json outputs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--summarise", type=Path, help="only summarise a CSV this script wrote")
    ap.add_argument("--evaluator", choices=("search", "critical-path"), default="search")
    ap.add_argument("--engine-csv", type=Path, help="reuse the engine steps of an earlier CSV of this script")
    args = ap.parse_args()
    if args.speed:
        speed(args.repeat)
        return
    if args.summarise:
        summarise(_read(args.summarise))
        return
    if args.examples:
        examples(args.engine_json)
        return
    compare(args.per_case, args.csv, args.evaluator, args.engine_csv)


if __name__ == "__main__":
    main()
