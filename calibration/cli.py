"""``simtrain calibrate`` / ``python -m calibration``: calibrate one machine and write its profile.

    simtrain calibrate --device cuda --model llama3-8b --layout "tp=2" --out my-h100
    simtrain calibrate --device cpu --out this-cpu
    simtrain calibrate --device cpu --config run.yaml --out this-cpu     # shapes of a run config
    simtrain calibrate --device cpu --quick --out smoke --json           # a smoke run (under a minute)

Steps: the single-device benchmarks for the target's exact kernels and the grids around them
(``calibration.compute``); then the multi-process part (``calibration.collectives``: collectives, and
on a CPU the contention between processes) with ``--processes`` ranks started here (gloo on a CPU;
NCCL when several GPUs are visible; across nodes run it under torchrun); then the fits and the
profile (``calibration.writer``). Every result is appended to the journal as it is measured, so
running the same command again after an interruption resumes where it stopped (``--fresh`` starts
over). A profile NAME is written to ``calibrated/NAME/`` of the user profile directory
(``$SIMTRAIN_PROFILES_DIR``, else the platform's user data dir: ``simtrain/hardware/profile_paths.py``); a path
is written where it points. A progress bar with an ETA goes to stderr when it is a terminal
(``calibration.progress``); ``--json`` prints one JSON object (the profile's path and the counts) to
stdout and nothing else. Exit status: 0 done, 1 a measurement run failed (a rank died), 2 bad
arguments, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from calibration import collectives
from calibration.compute import Context, PlanSettings, compute_plan, dtype_of, pending_of, run_plan
from calibration.device import describe, fingerprint
from calibration.journal import Journal, JournalMismatch, measurement_key
from calibration.launch import RankFailed, launch_local
from calibration.progress import CalibrationProgress
from calibration.shapes import CPU_DEFAULT_MODEL, Target, parse_layout, resolve_model, target_from_config
from calibration.timing import Clock, DeviceTimer, TimerSettings
from calibration.writer import build_profile, write_profile
from simtrain.hardware.profile import JOURNAL_FILE, profile_folder
from simtrain.spec.errors import ConfigError

MiB = 1024**2
L2_FLUSH_BYTES = 256 * MiB  # Triton do_bench's flush buffer; >= 2x the L2 of A100/H100/H200 (50 MB)


def parser() -> argparse.ArgumentParser:
    """The ``calibrate`` argument parser."""
    p = argparse.ArgumentParser(prog="simtrain calibrate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], required=True, help="what to calibrate")
    p.add_argument("--out", required=True, help="profile name (written to calibrated/NAME in the user profile directory: $SIMTRAIN_PROFILES_DIR, else the platform user data dir) or a folder path")
    p.add_argument("--model", help="preset name or Hugging Face config.json whose shapes to measure "
                                   f"(default: llama3-8b on cuda, {CPU_DEFAULT_MODEL.name} on cpu)")
    p.add_argument("--layout", default="", help='layout of the target run, e.g. "tp=2,sp=true" (default tp=1)')
    p.add_argument("--config", help="take model, tp, sp, seq_len and micro-batch size from a simtrain run config")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 4096 on cuda, 256 on cpu)")
    p.add_argument("--micro-batch-size", type=int, help="sequences per micro-batch (default 1 on cuda, 2 on cpu)")
    p.add_argument("--processes", type=int, help="ranks of the collective part (default: 2 on cpu, the GPUs on cuda)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per process (cpu; default 1)")
    p.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.WALL.value,
                   help="cpu: what a kernel's seconds are: wall (elapsed, default) or thread_cpu (the CPU time of "
                        "the measuring thread: on a machine shared with other processes it leaves out the time "
                        "they held the core; calibration.timing.Clock)")
    p.add_argument("--no-collectives", action="store_true", help="skip the multi-process part")
    p.add_argument("--quick", action="store_true", help="smaller grids, one round, fewer repetitions and shorter "
                                                        "windows: a smoke run (well under a minute on a 2-core CPU)")
    p.add_argument("--json", action="store_true", help="print only a JSON summary to stdout (no progress, no log)")
    p.add_argument("--fresh", action="store_true", help="discard earlier measurements of this profile")
    p.add_argument("--timeout-s", type=float, default=600.0, help="limit for the multi-process part, seconds")
    return p


def _target(args: argparse.Namespace) -> Target:
    cuda = args.device == "cuda"
    if args.config:
        return target_from_config(args.config)
    lay = parse_layout(args.layout)
    model = resolve_model(args.model or ("llama3-8b" if cuda else CPU_DEFAULT_MODEL.name))
    return Target(model, tp=lay.get("tp", 1), sp=lay.get("sp", False), seq_len=args.seq_len or (4096 if cuda else 256),
                  micro_batch_size=args.micro_batch_size or (1 if cuda else 2))


def _timer_settings(cuda: bool, quick: bool, clock: Clock = Clock.WALL) -> TimerSettings:
    if quick:
        return TimerSettings(warmup=1, min_repeats=3, max_repeats=10, target_s=0.05,
                             flush_bytes=L2_FLUSH_BYTES if cuda else 0, clock=Clock.WALL if cuda else clock)
    if cuda:
        return TimerSettings(warmup=5, min_repeats=10, max_repeats=100, target_s=0.1, flush_bytes=L2_FLUSH_BYTES)
    return TimerSettings(warmup=1, min_repeats=3, max_repeats=30, target_s=0.1, clock=clock)


def _collective_args(args: argparse.Namespace, folder: Path, target: Target) -> list[str]:
    m, tp = target.model, target.tp
    shape = (target.micro_batch_size, target.seq_len, m.hidden, max(m.ffn_hidden // tp, 1), max(m.n_heads // tp, 1),
             m.d_head)
    out = ["--out", str(folder), "--device", args.device, "--threads", str(args.threads), "--no-profile",
           "--timeout-s", str(min(args.timeout_s, 300.0)), "--work-shape", *map(str, shape)]
    if args.quick:  # 1 KiB .. 4 MiB in steps of 16x: 4 sizes per collective (a smoke run)
        out += ["--max-bytes", str(4 * MiB), "--size-factor", "16", "--quick"]
    return out


def _multiprocess(args: argparse.Namespace, folder: Path, target: Target, log: Any, journal: Journal,
                  progress: CalibrationProgress) -> None:
    cuda = args.device == "cuda"
    n = args.processes or (torch.cuda.device_count() if cuda else 2)
    if args.no_collectives or n < 2:
        if cuda and not args.no_collectives:
            log("one GPU: no collectives measured here; for them run "
                f"`torchrun --nproc-per-node N -m calibration.collectives --out {args.out}` on a multi-GPU node")
        return
    log(f"multi-process part: {n} ranks ({'nccl' if cuda else 'gloo'})")
    argv = _collective_args(args, folder, target)
    # what rank 0 will measure (the same plan collectives.py makes), for the progress bar: rank 0 appends one
    # journal line per measurement, so the lines added since the start count what is done
    sub = collectives._parser().parse_args(argv)
    plan = collectives.collective_plan(sub, n, n) + collectives.compute_checks(n, n, not cuda,
                                                                                 collectives.Effort.of(sub.quick))
    todo = sum(not journal.has(measurement_key(k, p)) for k, p in plan)
    phase = progress.phase(f"multi-process ({n} ranks)", todo)
    file = folder / JOURNAL_FILE
    start = _lines(file)
    launch_local(argv, n, args.threads, args.timeout_s, log_dir=folder / "logs",
                 rank0_stdout=not (args.json or progress.active),
                 on_poll=lambda: phase.update(min(_lines(file) - start, todo)))
    phase.update(todo)


def _lines(file: Path) -> int:
    try:
        with open(file, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def calibrate(args: argparse.Namespace, log: Any = print, progress: CalibrationProgress | None = None) -> Path:
    """Run the calibration ``args`` describe; returns the profile's path. ``progress``: the display (none
    by default)."""
    return calibrate_summary(args, log, progress)["profile"]


def calibrate_summary(args: argparse.Namespace, log: Any = print, progress: CalibrationProgress | None = None
                      ) -> dict[str, Any]:
    """Run the calibration ``args`` describe; returns ``profile`` (its path), ``name``, the compute counts
    by status and the wall time in seconds."""
    progress = progress or CalibrationProgress(False)
    t0 = time.perf_counter()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device here (use --device cpu)")
    target = _target(args)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = "bf16" if cuda else "fp32"
    timer = _timer_settings(cuda, args.quick, Clock(args.clock))
    desc = describe(device, dtype, args.threads if not cuda else 1)
    folder = profile_folder(args.out)
    header = {"fingerprint": fingerprint(desc), "device": desc, "software_stack": "eager_hf",
              "settings": {"timer": timer.to_dict(), "quick": bool(args.quick)},
              "calibrated_for": {**target.describe(), "model_spec": target.model.model_dump(mode="json")}}
    journal = Journal(folder / JOURNAL_FILE, header, fresh=args.fresh)
    resumed_clock = journal.header.get("settings", {}).get("timer", {}).get("clock", Clock.WALL.value)
    if resumed_clock != timer.clock.value:  # one profile, one clock: its kernels are summed into one step
        raise JournalMismatch(f"{journal.path} was measured with --clock {resumed_clock}, not {timer.clock.value}; "
                              "use the same --clock or start over with --fresh")
    plan = compute_plan(target, PlanSettings.for_device(args.device, args.quick))
    log(f"calibrating {desc['name']} ({args.device}, {dtype}) for {target.model.name} "
        f"tp={target.tp} s={target.seq_len} b={target.micro_batch_size}: {len(plan)} compute measurements")
    ctx = Context(device, dtype_of(dtype), DeviceTimer(device, timer))
    phase = progress.phase("single-device kernels", len(pending_of(plan, journal)))
    counts = run_plan(ctx, plan, target, journal, log, advance=phase.advance)
    log(f"compute: {counts['ok']} measured, {counts['oom']} out of memory, {counts['error']} failed, "
        f"{counts['skipped']} already done ({time.perf_counter() - t0:.0f} s)")
    _multiprocess(args, folder, target, log, journal, progress)
    final = Journal(folder / JOURNAL_FILE, header)
    path = write_profile(folder, build_profile(folder.name, final.header, final.records()))
    seconds = time.perf_counter() - t0
    log(f"profile written to {path} ({seconds:.0f} s); use it with "
        f"`simtrain simulate CONFIG --set hardware.profile={args.out}`")
    return {"profile": path, "name": folder.name, "device": args.device, "quick": bool(args.quick),
            "compute": counts, "seconds": round(seconds, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parser().parse_args(argv)
    progress = CalibrationProgress.for_cli(args.json)
    log = (lambda msg: None) if args.json else (lambda msg: print(msg, flush=True))
    try:
        with progress.running():
            summary = calibrate_summary(args, log=log, progress=progress)
    except (ConfigError, JournalMismatch) as exc:
        print(f"simtrain calibrate: {exc}", file=sys.stderr)
        return 2
    except RankFailed as exc:
        print(f"simtrain calibrate: the multi-process part failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("simtrain calibrate: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({**summary, "profile": str(summary["profile"])}, indent=2))
    return 0
