"""Where a CPU DDP step's time goes: forward, backward and optimizer of real transformers Llama steps in
four modes, beside simtrain's predicted phases.

    python benchmarks/ddp_phases.py tests/calibration/data/grid/l2-s1024-v8k.yaml --profile NAME

Modes (one thread per process, as ``calibration.realstep`` runs the CPU loop):

- ``solo``: one process;
- ``pair``: two processes, each training its own model (no DDP), started together each step: what two
  ranks' compute costs each other on the shared cores and memory;
- ``noop``: DDP over gloo with a comm hook that returns each bucket as it is: the reducer's own work
  (copying gradients into the buckets and back) without any communication;
- ``ddp``: DDP with its default all-reduce.

So ``noop - pair`` is the reducer's work and ``ddp - noop`` the gradient all-reduce's cost in the step
(exposed, and the cores it takes from the backward). Each phase is the median over the steps (after two
warm-up steps) on the slower rank; the last column is the median over the steps of the slower rank's step,
as ``calibration.realstep`` (and so the CPU grid) reports a DDP step. With ``--profile`` (a calibrated profile, ``SIMTRAIN_PROFILES_DIR``
honoured) simtrain's phases for one and two processes are printed too: forward = the end of the last
forward op, optimizer = from the optimizer op's start to the step's end, backward = the rest. Not a test:
it prints and exits 0.

Measured 2026-12-07 on this project's 2-vCPU VM (quiet host; medians of 12-15 steps, seconds, forward /
backward / optimizer / step):

- ``l2-s1024-v8k`` (profile ``exposed dp`` 33 ms): solo 0.32-0.34 / 0.64-0.66 / 0.05-0.09 / 1.01-1.11;
  pair 0.33-0.35 / 0.64-0.67 / 0.08-0.09 / 1.06-1.12; noop 0.33-0.35 / 0.68-0.73 / 0.08-0.09 / 1.08-1.16;
  ddp 0.34-0.35 / 0.74-0.79 / 0.09-0.10 / 1.18-1.23. simtrain: 0.337 / 0.655 / 0.092 / 1.084 (one
  process) and 0.335 / 0.713 / 0.092 / 1.140 (two).
- ``l6-s128-v32k``: solo 0.12 / 0.21-0.24 / 0.09-0.11 / 0.43-0.46; pair 0.12-0.13 / 0.22-0.23 / 0.09-0.11 /
  0.44-0.47; noop 0.12-0.14 / 0.24-0.26 / 0.09-0.11 / 0.47-0.51; ddp 0.12-0.13 / 0.32-0.33 / 0.12 /
  0.59-0.60. simtrain: 0.106 / 0.241 / 0.092 / 0.439 and 0.106 / 0.348 / 0.092 / 0.546.

Two ranks' compute costs each other little (``pair`` within 0-5 % of ``solo``, as the calibration's
contention factors of 0.99-1.01 say); the all-reduce's cost in the step (``ddp - noop``, 0.06-0.10 s on
``l2-s1024-v8k``) is about 1.5-2x simtrain's (exposed all-reduce plus the interference beside it, 0.045 s).
Separately, 20-30 % of DDP steps take 0.2-2 s longer, with the no-op hook too and in the thread's own CPU
time, never in one process or in ``pair``: they move a 5-step median by up to 30 %.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

WARMUP = 2
MODES = ("solo", "pair", "noop", "ddp")
PHASES = ("forward", "backward", "optimizer", "step")
COLUMNS = (*PHASES, "step, max of ranks")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _noop_hook(_, bucket):  # type: ignore[no-untyped-def]  # DDP checks the parameters against GradBucket
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _rank(rank: int, world: int, config: str, mode: str, steps: int, port: int, queue: Any) -> None:
    """Train ``steps`` timed steps; put (rank, [(forward, backward, optimizer, step) seconds per step])."""
    sys.path.insert(0, str(ROOT))
    from calibration.realstep import build_model, step_loss
    from calibration.shapes import read_run

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    run = read_run(config)
    torch.manual_seed(1234 + rank)
    model, _ = build_model(run.model, torch.float32, torch.device("cpu"))
    if mode in ("noop", "ddp"):
        model = nn.parallel.DistributedDataParallel(model)
        if mode == "noop":
            model.register_comm_hook(None, _noop_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, run.model.vocab, (run.train.micro_batch_size, run.train.seq_len))
    out = []
    for _ in range(WARMUP + steps):
        dist.barrier()  # the ranks start each step together (pair: no other synchronisation)
        t0 = time.perf_counter()
        loss = step_loss(model, ids)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        out.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    queue.put((rank, out[WARMUP:]))
    dist.barrier()
    dist.destroy_process_group()


def measure(config: str, mode: str, steps: int) -> dict[str, float]:
    """Per phase, the median over the steps on the slower rank (seconds)."""
    world = 1 if mode == "solo" else 2
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, config, mode, steps, port, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    results = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    out = {ph: max(statistics.median(s[i] for s in rows) for _, rows in results) for i, ph in enumerate(PHASES)}
    # what calibration.realstep reports for DDP: each step's time on the slower rank, then the median
    out["step, max of ranks"] = statistics.median(max(steps) for steps in zip(*(
        [s[3] for s in rows] for _, rows in results), strict=True))
    return out


def predicted(config: str, profile: str, processes: int) -> dict[str, float]:
    """simtrain's phases of rank 0 on ``profile`` (seconds)."""
    from calibration.compare import run_overrides
    from calibration.shapes import read_run
    from simtrain.studies.simulate import simulate

    mbs = read_run(config).train.micro_batch_size
    res = simulate(config, run_overrides(processes, mbs) + [f"hardware.profile={profile}"], trace=True)
    events = [e for e in res.trace or [] if e.rank == 0]
    fwd_end = max(e.end_s for e in events if e.category == "fwd")
    opt_start = min((e.start_s for e in events if e.category == "optimizer"), default=res.step_time_s)
    alike = res.step_time_s - res.breakdown_s["sync_wait"]  # the engine's step of identical ranks
    return {"forward": fwd_end, "backward": opt_start - fwd_end, "optimizer": alike - opt_start,
            "step": alike, "step, max of ranks": res.step_time_s}  # with the wait for the slower rank


def _line(label: str, phases: dict[str, float]) -> str:
    return f"{label:<22}" + "".join(f"{phases[c]:>11.3f}" for c in PHASES) + f"{phases[COLUMNS[-1]]:>20.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/ddp_phases.py", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a CPU-loop config (tests/calibration/data/grid/*.yaml, cpu_llama.yaml)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--profile", help="a calibrated profile of this CPU to print simtrain's phases from")
    args = p.parse_args(argv)
    print(f"{'seconds (median)':<22}" + "".join(f"{ph:>11}" for ph in PHASES) + "  step, max of ranks")
    for mode in args.modes:
        print(_line(mode, measure(args.config, mode, args.steps)), flush=True)
    if args.profile:
        for n in (1, 2):
            print(_line(f"simtrain, {n} process{'es' if n > 1 else ''}", predicted(args.config, args.profile, n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
