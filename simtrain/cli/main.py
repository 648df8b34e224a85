"""Command line: ``simtrain simulate | compare | validate | models | hardware`` (and the subcommands of cli_run, cli_formats).

Bad input prints every problem with its dotted path and exits with code 2; a result that breaks
an invariant (a simulator bug) exits with code 3; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from simtrain.cli import calibrate as cli_calibrate
from simtrain.cli import formats as cli_formats
from simtrain.cli.run import COMMANDS as RUN_COMMANDS
from simtrain.cli.run import add_parsers as add_run_parsers
from simtrain.cli.run import run_command
from simtrain.engine.results import StepResult
from simtrain.spec.errors import ConfigError, InfeasibleLayout, Problem, SimulationInvariantError, problem
from simtrain.studies import variability
from simtrain.studies.whatif import summary_lines

GiB = 1024.0**3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simtrain", description="Simulate distributed LLM training steps.")
    sub = p.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="simulate one training step of a config (YAML/JSON)")
    sim.add_argument("config", help="path to a run config (YAML or JSON)")
    sim.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field by dotted path, e.g. --set layout.tp=4 (repeatable)")
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.add_argument("--mode", choices=["symmetric", "full"], help="simulation mode (default: sim.mode)")
    sim.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the step "
                     "(gzip-compressed when FILE ends in .gz)")
    sim.add_argument("--timeline", action="store_true", help="include memory timelines in --json output")
    sim.add_argument("--error-table", metavar="FILE", help="measured-run errors behind the likely step-time range "
                     "(written by validate --error-table; default: simtrain's errors on the published runs)")
    cli_formats.add_source_options(sim)  # --hf-config, --format (simtrain/cli/formats.py)
    sub.add_parser("models", help="list model presets")
    sub.add_parser("hardware", help="list GPU and node profiles")
    val = sub.add_parser("validate", help="predict the measured runs of a CSV and report the error")
    val.add_argument("runs_csv", help="CSV of measured runs (columns of validation/published_runs.csv)")
    val.add_argument("--json", action="store_true", help="print the summary and rows as JSON")
    val.add_argument("--out", metavar="FILE", help="write one row per run (predictions, errors) as CSV")
    val.add_argument("--report", metavar="FILE", help="write an HTML report with the predicted-vs-measured plot")
    val.add_argument("--error-table", metavar="FILE", help="write the simulated runs' signed step-time errors, "
                     "the table simulate --error-table reads for its likely step-time range")
    val.add_argument("--workers", type=int, help="local worker processes (default: the CPUs; 1 = in-process)")
    val.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_run_parsers(sub)  # run, sweep, search, report (simtrain/cli/run.py)
    cmp = sub.add_parser("compare", help="simulate two configs (or one with two --set sets) side by side")
    cmp.add_argument("config_a", metavar="A", help="path to a run config (YAML or JSON)")
    cmp.add_argument("config_b", metavar="B", nargs="?", help="second config (default: A again, with --set-b)")
    cmp.add_argument("--set-a", dest="set_a", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field of A by dotted path (repeatable)")
    cmp.add_argument("--set-b", dest="set_b", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field of B by dotted path (repeatable)")
    cmp.add_argument("--set", dest="set_both", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field of both (applied before --set-a/--set-b; repeatable)")
    cmp.add_argument("--mode", choices=["symmetric", "full"], help="simulation mode of both (default: sim.mode)")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.add_argument("--markdown", metavar="FILE", help="write the comparison as Markdown")
    cmp.add_argument("--html", metavar="FILE", help="write the comparison as a self-contained HTML page")
    cli_formats.add_parsers(sub)  # import, export, schema (simtrain/cli/formats.py)
    cli_calibrate.add_parser(sub)  # calibrate: the torch suite in calibration/ (simtrain/cli/calibrate.py)
    return p


def _fmt_bytes(b: float) -> str:
    return f"{b / GiB:8.2f} GiB"


def render_summary(r: StepResult) -> str:
    """Human-readable summary of a StepResult."""
    bd = r.breakdown_s
    lay = r.layout
    lines = [
        f"simtrain: {r.name}  ({r.n_gpus} GPUs, {r.mode} mode)",
        f"  layout        dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} vpp={lay['vpp']} sp={lay['sequence_parallel']} "
        f"zero={lay['zero_stage']} fsdp={lay['fsdp']} recompute={lay['recompute']} "
        f"schedule={lay['schedule']}; {r.microbatches} micro-batches per step",
        f"  step time     {r.step_time_s:.4f} s   ({r.global_batch_tokens:,} tokens per step)",
        *_band_lines(r),
        *summary_lines(r.whatif),
        *variability.summary_lines(r.variability),
        f"  throughput    {r.tokens_per_s:,.0f} tokens/s, {r.tokens_per_s_per_gpu:,.1f} tokens/s/GPU",
        f"  FLOP rate     {r.model_tflops_per_gpu:.1f} model TFLOP/s/GPU (MFU {100 * r.mfu:.1f} %), "
        f"{r.hardware_tflops_per_gpu:.1f} hardware TFLOP/s/GPU (HFU {100 * r.hfu:.1f} %)",
        "  breakdown (critical rank):",
        f"    compute     {bd['compute']:.4f} s",
        f"    optimizer   {bd['optimizer']:.4f} s",
        f"    bubble      {bd['bubble']:.4f} s",
        f"    stage imbalance {bd['stage_imbalance']:.4f} s",
    ]
    for axis, t in bd["exposed_comm"].items():
        if t > 0:
            lines.append(f"    exposed {axis:<4}{t:.4f} s")
    if bd.get("offload", 0.0) > 0:
        lines.append(f"    CPU offload waits {bd['offload']:.4f} s")
    lines.append(f"    other       {bd['other']:.4f} s")
    if bd.get("sync_wait", 0.0) > 0:  # a calibrated profile's step jitter (simtrain.engine.sync_wait)
        lines.append(f"    wait for the slowest rank {bd['sync_wait']:.4f} s")
    lines.append("  memory per pipeline stage (peak, capacity):")
    for m in r.memory:
        verdict = "fits" if m.fits else "DOES NOT FIT"
        top = sorted(m.components.items(), key=lambda kv: -kv[1])[:4]
        parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in top)
        lines.append(f"    stage {m.stage:>3}: {_fmt_bytes(m.peak_bytes)} of {_fmt_bytes(m.capacity_bytes)}  "
                     f"{verdict}  ({parts} GiB)")
    lines.append("  verdict: " + ("fits in memory" if r.fits else "DOES NOT FIT in GPU memory"))
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def _band_lines(r: StepResult) -> list[str]:
    b = r.error_band
    if b is None:
        return []
    return [f"  likely range  {b.low_s:.4f} - {b.high_s:.4f} s measured ({100 * b.coverage:.0f} % prediction "
            f"interval): simtrain's error on {b.basis} ran {b.error_low_pct:+.1f} % to {b.error_high_pct:+.1f} %"]


def _cmd_simulate(args: argparse.Namespace) -> int:
    from simtrain.engine.trace import write_chrome_trace
    from simtrain.studies.simulate import simulate

    result = simulate(cli_formats.config_source(args), args.overrides, mode=args.mode, trace=bool(args.trace),
                      error_table=args.error_table)
    if args.trace:
        write_chrome_trace(args.trace, result.trace, result.stage_of, result.memory)
    if args.json:
        print(json.dumps(result.to_dict(timeline=args.timeline), indent=2))
    else:
        print(render_summary(result))
        if args.trace:
            print(f"  trace written to {args.trace}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from simtrain.studies.compare import compare, render_text, write_outputs

    if args.config_b is None and not (args.set_a or args.set_b):
        raise ConfigError(Problem("B", "missing: give a second config, or --set-a/--set-b overrides that make "
                                  "two configs of A"))
    c = compare(args.config_a, args.config_b, args.set_both + args.set_a, args.set_both + args.set_b,
                mode=args.mode)
    written = write_outputs(c, args.markdown, args.html)
    if args.json:
        print(json.dumps(c.to_dict(), indent=2))
    else:
        print(render_text(c))
        for path in written:
            print(f"  wrote {path}")
    return 0


def _cmd_models() -> int:
    from simtrain.spec.model import preset_table

    rows = preset_table()
    print(f"{'preset':<16}{'params':>10}{'active':>10}{'layers':>8}{'hidden':>8}{'heads':>7}{'kv':>5}{'ffn':>8}"
          f"{'vocab':>9}  experts")
    for r in rows:
        active = r.get("active_params_B", r["params_B"])
        print(f"{r['name']:<16}{r['params_B']:>9.2f}B{active:>9.2f}B{r['layers']:>8}{r['hidden']:>8}{r['heads']:>7}"
              f"{r['kv_heads']:>5}{r['ffn']:>8}{r['vocab']:>9}  {r.get('experts') or '-'}")
    return 0


def _cmd_hardware() -> int:
    from simtrain.hardware.load import gpu_table, node_table

    print("GPUs:")
    for row in gpu_table():
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    print("Nodes:")
    for row in node_table():
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    from simtrain.hardware.profile import list_profiles
    from simtrain.hardware.profile_paths import user_root

    print(f"Calibrated profiles (built-in, and yours in {user_root()}):")
    for name in list_profiles():
        print(f"  {name}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from simtrain.engine.trace import write_atomic
    from simtrain.studies.uncertainty import error_table
    from simtrain.validation.fidelity import (
        render_html,
        render_table,
        to_csv_text,
        to_json_dict,
        validate_runs,
    )

    if args.workers is not None and args.workers < 1:
        raise ConfigError(problem("--workers", args.workers, "a positive number of processes"))
    from simtrain.studies.progress import wanted

    frame, summary = validate_runs(args.runs_csv, workers=args.workers, progress=wanted(args.json, args.no_progress))
    if args.out:
        write_atomic(args.out, to_csv_text(frame))
    if args.report:
        write_atomic(args.report, render_html(frame, summary))
    if args.error_table:
        write_atomic(args.error_table, error_table(frame).to_csv(index=False))
    if args.json:
        print(json.dumps(to_json_dict(frame, summary), indent=2, default=str))
    else:
        print(render_table(frame, summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simtrain`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:  # its options belong to the suite (python -m calibration)
        return cli_calibrate.main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "simulate":
            return _cmd_simulate(args)
        if args.command == "validate":
            return _cmd_validate(args)
        if args.command == "compare":
            return _cmd_compare(args)
        if args.command == "models":
            return _cmd_models()
        if args.command in RUN_COMMANDS:
            return run_command(args)
        if args.command in cli_formats.COMMANDS:
            return cli_formats.run_command(args)
        return _cmd_hardware()
    except ConfigError as exc:
        print(f"simtrain: {exc}", file=sys.stderr)
        return 2
    except SimulationInvariantError as exc:  # a simulator bug, not bad input
        print(f"simtrain: {exc}", file=sys.stderr)
        return 3
    except InfeasibleLayout as exc:
        print(f"simtrain: cannot simulate this layout: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"simtrain: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
