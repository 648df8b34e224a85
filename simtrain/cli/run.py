"""Subcommands ``simtrain run | sweep | search | report`` (wired into ``simtrain.cli.main``).

Bad input raises ConfigError (every problem with its path), which ``simtrain.cli.main.main`` prints before
exiting with status 2; results go to stdout, progress bars to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from simtrain.cli.formats import FORMATS, add_source_options, best_config, config_source, export_config
from simtrain.spec.errors import ConfigError, Problem

COMMANDS = ("run", "sweep", "search", "report")


def add_parsers(sub: Any) -> None:
    """Add the run/sweep/search/report subparsers to ``simtrain``'s subparser group."""
    run = sub.add_parser("run", help="whole training run over its batch schedule: time to train, GPU-hours, cost")
    _common(run)
    run.add_argument("--tokens", help="token budget (run.tokens), e.g. 1.4T")
    run.add_argument("--price", type=float, help="price per GPU-hour (run.price_per_gpu_hour)")
    run.add_argument("--mode", choices=["symmetric", "full"], help="simulation mode (default: sim.mode)")
    run.add_argument("--whatif-batches", metavar="TOKENS,...",
                     help="convergence what-if: time to the target loss at these global batches (tokens, e.g. 2M,4M)")
    run.add_argument("--noise-scale-tokens", help="gradient noise scale B_noise in tokens (what-if)")
    run.add_argument("--target-loss", type=float, help="target loss in nats, to estimate B_noise (what-if)")
    run.add_argument("--checkpoint-sweep", action="store_true",
                     help="goodput against the checkpoint interval (run.failures/run.checkpoint, or their defaults)")
    run.add_argument("--out", help="write the phases (or the what-if table, or the checkpoint sweep) as .parquet or .csv")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    sw = sub.add_parser("sweep", help="simulate a config over a grid of field values; one table row per point")
    _common(sw)
    sw.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", required=True,
                    help="a field and its values, e.g. --grid layout.tp=1,2,4,8 (repeatable; layout.dp=auto fills "
                         "the cluster)")
    sw.add_argument("--out", help="write the table (.parquet or .csv)")
    _workers(sw)

    se = sub.add_parser("search", help="rank every valid layout of a config's model and batch on a GPU count")
    _common(se)
    se.add_argument("--gpus", type=int, help="GPUs (a multiple of the node's GPUs; default: the config's)")
    se.add_argument("--top", type=int, default=8, help="simulate up to this many best estimates (default 8)")
    se.add_argument("--budget", type=int, help="simulation budget, micro-batches x layers (default 100,000)")
    se.add_argument("--show", type=int, default=15, help="candidates to print (default 15)")
    for knob in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero"):
        se.add_argument(f"--{knob}", metavar="N,...", help=f"restrict {knob} to these values")
    se.add_argument("--schedule", metavar="KIND,...",
                    help="pipeline schedules to try: auto (1F1B/interleaved), dualpipe, dualpipev, zb_h1 "
                         "(default: auto; MoE models auto,dualpipe,dualpipev)")
    se.add_argument("--recompute", metavar="KIND,...", help="restrict the memory levers to none,selective,full,offload (offload: CPU activation offloading, pp 1)")
    se.add_argument("--out", help="write every candidate as a table (.parquet or .csv)")
    se.add_argument("--export-best", nargs=2, metavar=("FORMAT", "FILE"),
                    help=f"write the best layout's config as {' or '.join(FORMATS)} (or simtrain: YAML) to FILE")
    _workers(se)

    rep = sub.add_parser("report", help="HTML report with plots, Markdown/CSV tables, from a sweep/search table")
    rep.add_argument("table", help="a .parquet or .csv table written by sweep, search or run --out")
    rep.add_argument("--html", help="write the self-contained HTML report here")
    rep.add_argument("--md", help="write the Markdown table here")
    rep.add_argument("--csv", help="write the best-layouts table as CSV here")
    rep.add_argument("--title", default="simtrain report", help="report title")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="path to a run config (YAML or JSON)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field by dotted path (repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_source_options(p)  # --hf-config, --format (simtrain/cli/formats.py)


def _workers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, help="local worker processes (default: the CPUs; 1 = in-process)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on a Dask distributed scheduler (tcp://host:8786)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_command(args: argparse.Namespace) -> int:
    """Dispatch a run/sweep/search/report command; returns the exit code."""
    return {"run": _cmd_run, "sweep": _cmd_sweep, "search": _cmd_search, "report": _cmd_report}[args.command](args)


def _progress(args: argparse.Namespace) -> bool:
    """A progress bar on stderr: only on a terminal, never with --json or --no-progress."""
    from simtrain.studies.progress import wanted

    return wanted(args.json, args.no_progress)


def _count(text: str, path: str) -> float:
    from simtrain.spec.batch import parse_count

    value = parse_count(text)
    if not isinstance(value, float) or value <= 0:
        raise ConfigError(Problem(path, f"{text!r} is not a positive count (e.g. 4194304, 4M, 1.4T)"))
    return value


def _ints(text: str | None, path: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(Problem(path, f"{text!r} is not a comma-separated list of integers")) from None
    if not values or min(values) < 0:
        raise ConfigError(Problem(path, f"{text!r} needs at least one non-negative integer"))
    return values


# -- run --------------------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.tokens:
        overrides.append(f"run.tokens={_count(args.tokens, '--tokens'):.17g}")
    if args.price is not None:
        overrides.append(f"run.price_per_gpu_hour={args.price!r}")
    if args.whatif_batches:
        return _cmd_whatif(args, overrides)
    from simtrain.studies.run import render_run, simulate_run

    result = simulate_run(config_source(args), overrides, mode=args.mode, goodput=args.checkpoint_sweep,
                          progress=_progress(args))
    if args.checkpoint_sweep:
        return _checkpoint_sweep(args, result)
    if args.out:
        import pandas as pd

        from simtrain.studies.sweep import write_table

        write_table(pd.DataFrame([vars_of(p) for p in result.phases]), args.out)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_run(result))
        if args.out:
            print(f"  phases written to {args.out}")
    return 0


def _checkpoint_sweep(args: argparse.Namespace, result: Any) -> int:
    """Print (and with ``--out`` write) goodput against the checkpoint interval."""
    from simtrain.studies.goodput import interval_sweep
    from simtrain.studies.run import render_run

    assert result.goodput_inputs is not None
    rows = interval_sweep(result.goodput_inputs)
    if args.out:
        import pandas as pd

        from simtrain.studies.sweep import write_table

        write_table(pd.DataFrame(rows), args.out)
    if args.json:
        print(json.dumps({**result.to_dict(), "checkpoint_sweep": rows}, indent=2))
        return 0
    print(render_run(result))
    print(f"  checkpoint sweep ({result.goodput.mode} saving):")
    print(f"    {'interval (min)':>14} {'steps':>9} {'goodput %':>10} {'days':>8} {'GPU-hours':>14} {'ckpt (h)':>9}"
          f" {'restart (h)':>11} {'re-done (h)':>11}")
    for r in rows:
        print(f"    {r['interval_s'] / 60:>14,.1f} {r['interval_steps']:>9,.0f} {100 * r['goodput']:>10.2f} "
              f"{r['time_to_train_s'] / 86400:>8,.2f} {r['gpu_hours']:>14,.0f} {r['checkpoint_s'] / 3600:>9,.1f} "
              f"{r['restart_s'] / 3600:>11,.1f} {r['lost_work_s'] / 3600:>11,.1f}" + ("  <- optimum" if r["optimum"] else ""))
    if args.out:
        print(f"  sweep written to {args.out}")
    return 0


def vars_of(obj: Any) -> dict[str, Any]:
    """A slotted dataclass as a dict."""
    from dataclasses import asdict

    return asdict(obj)


def _cmd_whatif(args: argparse.Namespace, overrides: list[str]) -> int:
    from simtrain.studies.run import batch_whatif

    batches = [int(_count(b, "--whatif-batches")) for b in args.whatif_batches.split(",") if b.strip()]
    noise = _count(args.noise_scale_tokens, "--noise-scale-tokens") if args.noise_scale_tokens else None
    rows, info = batch_whatif(config_source(args), batches, overrides, b_noise_tokens=noise, target_loss=args.target_loss)
    for row in rows:
        row["deepseek_b_opt_tokens"] = info["deepseek_b_opt_tokens"]
    if args.out:
        from simtrain.studies.sweep import to_frame, write_table

        write_table(to_frame([{"point": i, **r} for i, r in enumerate(rows)]), args.out)
    if args.json:
        print(json.dumps({"model": info, "points": rows}, indent=2))
        return 0
    print(f"convergence what-if ({info['model']})")
    print(f"  B_noise = {info['b_noise_tokens']:,.0f} tokens ({info['b_noise_source']}); "
          f"E_min = {info['e_min_tokens']:,.0f} tokens; S_min = {info['s_min_steps']:,.0f} steps")
    print(f"  DeepSeek LLM fit at this run's compute ({info['compute_flops']:.3g} FLOPs): B_opt = "
          f"{info['deepseek_b_opt_tokens']:,.0f} tokens, peak LR {info['deepseek_lr_opt']:.2e}")
    print(f"  {'batch tokens':>14}{'step (s)':>10}{'MFU %':>7}{'steps':>10}{'tokens':>18}{'to target (h)':>15}"
          f"{'budget (h)':>12}")
    for r in rows:
        if r["error"]:
            print(f"  {r['train.global_batch_tokens']:>14,}  error: {r['error']}")
            continue
        print(f"  {r['train.global_batch_tokens']:>14,}{r['step_time_s']:>10.3f}{100 * r['mfu']:>7.1f}"
              f"{r['steps_to_target']:>10,}{r['tokens_to_target']:>18,.0f}{r['time_to_target_s'] / 3600:>15,.1f}"
              f"{r['time_to_train_s'] / 3600:>12,.1f}")
    return 0


# -- sweep ------------------------------------------------------------------------------------------
def _cmd_sweep(args: argparse.Namespace) -> int:
    from simtrain.studies.report import markdown_table, summary_table
    from simtrain.studies.sweep import parse_grid, sweep, write_table

    df = sweep(config_source(args), args.grid, args.overrides, workers=args.workers, scheduler=args.scheduler,
               progress=_progress(args))
    if args.out:
        write_table(df, args.out)
    if args.json:
        print(df.drop(columns=["memory_json"], errors="ignore").to_json(orient="records", indent=2))
        return 0
    failed = df[df["error"].notna()]
    print(f"simtrain sweep: {len(df)} points, {len(failed)} failed" + (f"; table written to {args.out}" if args.out else ""))
    print(markdown_table(summary_table(df, 10)), end="")
    if len(failed):
        print(f"failed points ({len(failed)}):")
        grid = [c for c in df.columns if c in set(parse_grid(args.grid))]
        for _, row in failed.iterrows():
            values = ", ".join(f"{k}={row[k]}" for k in grid)
            print(f"  point {row['point']} ({values}): " + str(row["error"]).replace("\n", "\n    "))
    return 0


# -- search -----------------------------------------------------------------------------------------
def _cmd_search(args: argparse.Namespace) -> int:
    from simtrain.studies.search import DEFAULT_BUDGET_UNITS
    from simtrain.studies.search import search as run_search
    from simtrain.studies.search_render import render_search
    from simtrain.studies.search_space import (
        MICRO_BATCHES,
        RECOMPUTE,
        SEARCH_SCHEDULES,
        ZERO_STAGES,
        SearchSpace,
    )

    rec = tuple(r.strip() for r in args.recompute.split(",")) if args.recompute else RECOMPUTE
    bad = [r for r in rec if r not in RECOMPUTE]
    if bad:
        raise ConfigError(Problem("--recompute", f"{bad!r} not valid; use {', '.join(RECOMPUTE)}"))
    schedules = tuple(k.strip() for k in args.schedule.split(",")) if args.schedule else None
    bad = [k for k in schedules or () if k not in SEARCH_SCHEDULES]
    if bad:
        raise ConfigError(Problem("--schedule", f"{bad!r} not valid; use {', '.join(SEARCH_SCHEDULES)}"))
    zero = _ints(args.zero, "--zero") or ZERO_STAGES
    if any(z > 3 for z in zero):
        raise ConfigError(Problem("--zero", f"{args.zero!r}: ZeRO stages are 0-3"))
    space = SearchSpace(tp=_ints(args.tp, "--tp"), pp=_ints(args.pp, "--pp"), vpp=_ints(args.vpp, "--vpp"),
                        cp=_ints(args.cp, "--cp"), micro_batch_size=_ints(args.mbs, "--mbs") or MICRO_BATCHES,
                        zero_stage=zero, recompute=rec, ep=_ints(args.ep, "--ep"), etp=_ints(args.etp, "--etp"),
                        schedule=schedules)
    if args.export_best and args.export_best[0] not in (*FORMATS, "simtrain"):
        raise ConfigError(Problem("--export-best", f"{args.export_best[0]!r} is not valid; use "
                                                   f"{', '.join(FORMATS)} or simtrain"))
    source = config_source(args)
    result = run_search(source, gpus=args.gpus, space=space, top_k=args.top,
                        budget_units=args.budget or DEFAULT_BUDGET_UNITS, overrides=args.overrides,
                        workers=args.workers, scheduler=args.scheduler, progress=_progress(args))
    if args.out:
        from simtrain.studies.sweep import write_table

        write_table(result.to_frame(), args.out)
    if args.json:
        print(json.dumps(result.to_dict(limit=args.show), indent=2, default=_json_default))
    else:
        print(render_search(result, args.show))
        if args.out:
            print(f"  all {len(result.candidates)} candidates written to {args.out}")
    if args.export_best:
        _export_best(source, args, result)
    return 0


def _export_best(source: Any, args: argparse.Namespace, result: Any) -> None:
    """Write the best layout's config (simtrain YAML, Megatron arguments or torchtitan TOML)."""
    fmt, path = args.export_best
    best = best_config(source, args.overrides, result)
    if fmt == "simtrain":
        from simtrain.cli.formats import config_yaml
        from simtrain.engine.trace import write_atomic

        write_atomic(path, config_yaml(best))
        print(f"wrote {path}", file=sys.stderr)
    else:
        export_config(best, fmt, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return str(obj)


# -- report -----------------------------------------------------------------------------------------
def _cmd_report(args: argparse.Namespace) -> int:
    from simtrain.studies.report import check_table, render_markdown, write_report
    from simtrain.studies.sweep import read_table

    df = read_table(args.table)
    check_table(df, args.table)
    if not (args.html or args.md or args.csv):
        print(render_markdown(df, args.title, args.table), end="")
        return 0
    for path in write_report(df, args.html, args.md, args.csv, title=args.title, source=args.table):
        print(f"wrote {path}")
    return 0
