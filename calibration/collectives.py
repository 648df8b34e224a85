"""Multi-process measurements: collectives, compute contention, and the GEMM slowdown during a collective.

Run under torchrun (``torchrun --nproc-per-node 8 -m calibration.collectives --out my-h100``; several
nodes: the usual ``--nnodes/--rdzv-*`` arguments), or through ``simtrain calibrate --device cpu``,
which starts the ranks itself (``calibration.launch``). Rank 0 appends every result to the profile's
journal and rewrites the profile at the end, so compute measurements already there are kept.

What is measured (rank 0's journal keys make a rerun resume where it stopped):

- collectives through torch.distributed: all_reduce, all_gather, reduce_scatter, all_to_all,
  broadcast and send/recv, at the real group sizes (powers of two up to the ranks of one node, one
  node, and across nodes the rail group and the world), sizes from 1 KiB up by ``--size-factor``
  to ``--max-bytes`` (1 GiB on GPUs). Each point: warm-up, then repetitions each started after a
  barrier; a repetition's time is the slowest rank's (nccl-tests reports the max over ranks); the
  median is kept. algbw = S / t and busbw = algbw x factor follow nccl-tests (reference Table B);
- contention (CPU, one node): a GEMM, a copy and an attention kernel at the run's shapes timed on
  rank 0 alone and while the other ranks train (a decoder layer's forward and backward), in
  alternating pairs of windows; the median of the pairs' ratios is the slowdown of compute when the
  processes share the cores (timed by the thread's CPU time when each rank has a core of its own:
  ``contention_clock``);
- interference: the run's GEMM timed on every rank while all-reduces run beside it (``async_op``),
  against the same GEMM in a window right before each (Calculon's processor_usage, reference Notes 2.4).

Every process group has a timeout (``--timeout-s``): a rank that dies ends the others with an error
rather than a hang.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from calibration import ops
from calibration.device import describe, fingerprint
from calibration.journal import Journal, measurement_key
from calibration.steal import MAX_STEAL_FRACTION, cpu_ticks, steal_fraction
from calibration.timing import Clock
from calibration.writer import build_profile, write_profile
from simtrain.hardware.profile import JOURNAL_FILE, profile_folder
from simtrain.spec.collective_kinds import CollectiveKind

KiB, MiB, GiB = 1024, 1024**2, 1024**3
#: What this script measures (a profile stores each by its string value: ``simtrain.hardware.profile`` parses it back).
COLLECTIVES = (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER,
               CollectiveKind.ALL_TO_ALL, CollectiveKind.BROADCAST, CollectiveKind.SEND)
FAIL_RANK_ENV = "SIMTRAIN_CALIBRATION_FAIL_RANK"  # fault injection for tests: this rank raises at start
WINDOW_S = 0.6  # seconds each rank spends in an interference window
#: Contention kernel shapes without a target run: (micro-batch size, sequence length, hidden, FFN width,
#: query heads, head dim)
DEFAULT_WORK_SHAPE = (1, 1024, 1024, 1024, 8, 64)
CONTENTION_ROUNDS = 5  # alternating solo / shared window pairs per op class (median of their ratios)
CONTENTION_WINDOW_S = 0.6  # seconds of one contention window: several of the background's layer steps (~0.2 s)


@dataclass(frozen=True, slots=True)
class Effort:
    """How long the multi-process measurements spend: the full settings, or ``--quick``'s (a smoke run:
    fewer contention pairs, shorter windows, fewer repetitions per collective, a smaller interference
    all-reduce; the profile has every section, with noisier numbers)."""

    contention_rounds: int = CONTENTION_ROUNDS
    contention_window_s: float = CONTENTION_WINDOW_S
    window_s: float = WINDOW_S
    collective_reps: int = 20  # repetitions of a message under 16 MiB (5 above)
    interference_rounds: int = 7
    interference_cpu_bytes: int = 64 * MiB  # the all-reduce beside the GEMMs on a CPU (256 MiB on GPUs)

    @classmethod
    def of(cls, quick: bool) -> Effort:
        return cls(2, 0.3, 0.2, 5, 1, 16 * MiB) if quick else cls()


def _kinds(text: str) -> tuple[CollectiveKind, ...]:
    """The ``--collectives`` list: names of measurable kinds, comma separated."""
    valid = {k.value: k for k in COLLECTIVES}
    bad = [k for k in text.split(",") if k and k not in valid]
    if bad:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))} not measurable; expected a comma-separated "
                                         f"subset of {','.join(valid)}")
    return tuple(valid[k] for k in text.split(",") if k)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m calibration.collectives",
                                description="Measure collectives (and multi-process compute effects) for a profile.")
    p.add_argument("--out", required=True, help="profile name (calibrated/NAME in the user profile directory) or folder path")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], help="compute dtype (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank (cpu)")
    p.add_argument("--min-bytes", type=int, default=KiB)
    p.add_argument("--max-bytes", type=int, help="largest message (default: 1 GiB on cuda, 64 MiB on cpu)")
    p.add_argument("--size-factor", type=int, help="ratio between message sizes (default 2 on cuda, 4 on cpu)")
    p.add_argument("--collectives", type=_kinds, default=COLLECTIVES, help="comma-separated subset of "
                   + ",".join(COLLECTIVES))
    p.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout, seconds")
    p.add_argument("--fresh", action="store_true", help="discard the journal instead of resuming it")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter windows (smoke runs)")
    p.add_argument("--no-profile", action="store_true",
                   help="only journal the measurements (`simtrain calibrate` writes the profile itself afterwards)")
    p.add_argument("--no-compute-checks", action="store_true", help="skip contention and interference")
    p.add_argument("--work-shape", type=int, nargs=6, default=list(DEFAULT_WORK_SHAPE),
                   metavar=("B", "S", "HIDDEN", "FFN", "HEADS", "HEAD_DIM"),
                   help="the run's micro-batch size, sequence length, hidden, per-rank FFN width, per-rank query "
                        "heads and head dim: the shapes of the contention kernels")
    return p


def _env() -> tuple[int, int, int, int]:
    """(rank, world, local rank, ranks per node) from torchrun's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, world, int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def groups_to_measure(world: int, per_node: int) -> list[tuple[tuple[int, ...], int]]:
    """(ranks, nodes) of every group measured: 2, 4, ... ranks of node 0 and the whole node; across
    nodes, the rail group (local rank 0 of every node) and the world. All contain rank 0."""
    sizes = sorted({p for p in (2**i for i in range(1, 20)) if p <= per_node} | ({per_node} if per_node > 1 else set()))
    out = [(tuple(range(p)), 1) for p in sizes]
    nodes = world // per_node
    if nodes > 1:
        out.append((tuple(range(0, world, per_node)), nodes))
        out.append((tuple(range(world)), nodes))
    return out


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes`` multiplying by ``factor``."""
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


class Ctx:
    """The rank's view: device, groups, timers."""

    def __init__(self, device: torch.device, rank: int, world: int):
        self.device, self.rank, self.world = device, rank, world
        self.groups: dict[tuple[int, ...], Any] = {}
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def group(self, ranks: tuple[int, ...]) -> Any:
        return None if len(ranks) == self.world else self.groups[ranks]


def _op(kind: CollectiveKind, ranks: tuple[int, ...], size: int, ctx: Ctx) -> Callable[[], None]:
    """A callable running one collective of nccl-tests size ``size`` on ``ranks`` (fp32 elements)."""
    p, group = len(ranks), ctx.group(ranks)
    n = max(size // 4 // p, 1) * p
    dev = ctx.device
    if kind is CollectiveKind.ALL_REDUCE:
        x = torch.randn(n, device=dev)
        return lambda: dist.all_reduce(x, group=group)
    if kind is CollectiveKind.ALL_GATHER:
        x, out = torch.randn(n // p, device=dev), torch.empty(n, device=dev)
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: gather(out, x, group=group)
    if kind is CollectiveKind.REDUCE_SCATTER:
        x, out = torch.randn(n, device=dev), torch.empty(n // p, device=dev)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: scatter(out, x, group=group)
    if kind is CollectiveKind.ALL_TO_ALL:
        x, out = torch.randn(n, device=dev), torch.empty(n, device=dev)
        return lambda: dist.all_to_all_single(out, x, group=group)
    if kind is CollectiveKind.BROADCAST:
        x = torch.randn(n, device=dev)
        return lambda: dist.broadcast(x, src=ranks[0], group=group)
    if kind is not CollectiveKind.SEND:
        raise ValueError(f"calibration does not measure a {kind.value}")
    x = torch.randn(n, device=dev)
    peer = ranks[-1] if ctx.rank == ranks[0] else ranks[0]
    return (lambda: dist.send(x, peer)) if ctx.rank == ranks[0] else (lambda: dist.recv(x, peer))


def time_collective(kind: CollectiveKind, ranks: tuple[int, ...], size: int, ctx: Ctx, effort: Effort = Effort()
                    ) -> dict[str, float]:
    """Median over repetitions of the slowest member's time; call on every member of ``ranks``."""
    group = ctx.group(ranks)
    fn = _op(kind, ranks, size, ctx)
    reps = min(5, effort.collective_reps) if size >= 16 * MiB else effort.collective_reps
    for _ in range(2):
        fn()
    ctx.sync()
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        if ctx.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    xs = sorted(slowest.tolist())
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 4 else [xs[0], 0.0, xs[-1]]
    return {"median_s": statistics.median(xs), "p25_s": q[0], "p75_s": q[2], "min_s": xs[0], "repeats": len(xs)}


def collective_plan(args: argparse.Namespace, world: int, per_node: int) -> list[tuple[str, dict[str, Any]]]:
    """(kind, params) of every collective measurement."""
    max_bytes = args.max_bytes or (GiB if args.device == "cuda" else 64 * MiB)
    factor = args.size_factor or (2 if args.device == "cuda" else 4)
    kinds = _kinds(args.collectives) if isinstance(args.collectives, str) else args.collectives
    plan = []
    for ranks, nodes in groups_to_measure(world, per_node):
        for kind in kinds:
            if kind is CollectiveKind.SEND and len(ranks) != 2 and not (nodes > 1 and len(ranks) == nodes):
                continue
            for size in message_sizes(args.min_bytes, max_bytes, factor):
                rr, nn = (ranks, nodes) if kind is not CollectiveKind.SEND else ((ranks[0], ranks[1]), min(nodes, 2))
                plan.append(("collective", {"collective": kind.value, "ranks": len(rr), "nodes": nn, "size_bytes": size,
                                            "members": list(rr)}))
    return plan


def _windowed(fn: Callable[[], None], ctx: Ctx, deadline: float, during: Callable[[], bool] | None = None,
              clock: Callable[[], float] = time.perf_counter,
              reduce: Callable[[list[float]], float] = statistics.median) -> float:
    """Time of ``fn`` by ``clock`` (seconds; ``reduce`` of the calls' times, their median by default), ``fn``
    repeated until ``deadline`` (wall clock), or while ``during()`` is true.

    Without ``during``, ``fn`` runs at least once: on a loaded machine the window may have passed by the
    time this rank is scheduled again (a short ``--quick`` window read NaN so)."""
    times: list[float] = []
    while True:
        if during is not None and not during():
            break
        if time.time() >= deadline and (times or during is not None):
            break
        t0 = clock()
        fn()
        ctx.sync()
        times.append(clock() - t0)
    return reduce(times) if times else float("nan")


def contention_clock(ctx: Ctx) -> Clock:
    """The clock that times the contention windows' kernels: the thread's CPU time when every rank has a
    core of its own (one compute thread per rank, no more ranks than the CPUs this process may run on),
    else the wall clock.

    Each rank on its own core, a peer slows a rank's kernels only through the hardware they share (SMT
    siblings, caches, memory bandwidth), and the thread's CPU time counts that; the time the thread is
    descheduled is then held by a process outside the run. On this project's 2-vCPU machine one such
    process turned a 2-rank GEMM factor of 1.00-1.02 (two calibrations in a row) into 1.46 (~1.5: in the
    shared window three busy threads took turns on two vCPUs) and mispredicted that config's DDP step by
    +27 %. With more ranks than cores, taking turns is the run's own contention, which only wall time holds."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    own_core = not ctx.cuda and torch.get_num_threads() == 1 and ctx.world <= cpus
    return Clock.THREAD_CPU if own_core else Clock.WALL


def _compute_ops(ctx: Ctx, dtype: torch.dtype, shape: tuple[int, ...]) -> dict[str, Callable[[], None]]:
    """Kernels of each op class for the contention measurement, at the run's shapes ``shape`` = (micro-batch
    size, sequence length, hidden, per-rank FFN width, per-rank query heads, head dim): the MLP's up
    projection (tokens x hidden @ hidden x ffn), a copy of its output (the largest elementwise tensor) and
    the causal attention of one micro-batch. Shared caches and memory bandwidth make the slowdown depend
    on the working set: a 1024^3 fp32 GEMM (12 MB of operands per process) read 1.8-1.9x on this project's
    2-vCPU CI machine while the run's 512 x 512 x 1536 GEMMs ran a real 2-process step only ~1.1x slower."""
    b, s, h, f, heads, d = shape
    x, w = torch.randn(b * s, h, device=ctx.device, dtype=dtype), torch.randn(h, f, device=ctx.device, dtype=dtype)
    src = torch.randn(b * s * f, device=ctx.device, dtype=dtype)
    dst = torch.empty_like(src)
    q = torch.randn(b, s, heads, d, device=ctx.device, dtype=dtype)
    return {"gemm": lambda: torch.mm(x, w), "memory": lambda: dst.copy_(src),
            "attention": lambda: ops.attention(q, q, q)}


def measure_contention(ctx: Ctx, dtype: torch.dtype, shape: tuple[int, ...] = DEFAULT_WORK_SHAPE,
                       effort: Effort = Effort()) -> dict[str, dict[str, Any]]:
    """Per op class: rank 0's time of the class's kernel alone, and while every other rank trains (forward
    and backward of a decoder layer at the run's shapes, ``_background``), and their ratio.

    The other ranks run the training mix rather than the same kernel, because that is what a rank's
    kernels share the cores with in a real step: two loops of the same GEMM (1024^3 fp32) read 1.8-1.9x
    on this project's 2-vCPU CI machine while a real 2-process step ran only ~1.1x slower than one process
    (heavy GEMM phases of two processes coincide only part of the time). A shared machine's speed drifts
    by 10-20 % within seconds, so ``CONTENTION_ROUNDS`` solo/shared pairs alternate and the factor is the
    median of the per-pair ratios (each pair's windows are adjacent in time, so a drift cancels in its
    ratio). A pair during which the hypervisor stole more than ``MAX_STEAL_FRACTION`` of the CPU time
    (``calibration.steal``) is not counted, and another is run in its place (at most as many again).
    """
    out = {}
    clock = contention_clock(ctx)
    background = _background(ctx, dtype, shape)
    background()
    for cls, fn in _compute_ops(ctx, dtype, shape).items():
        fn()
        pairs: list[tuple[float, float]] = []
        for _ in range(2 * effort.contention_rounds):
            ticks = cpu_ticks()
            pair = _contention_pair(ctx, fn, background, effort.contention_window_s, clock)
            flag = [pair if steal_fraction(ticks, cpu_ticks()) <= MAX_STEAL_FRACTION else None]
            dist.broadcast_object_list(flag, src=0)  # rank 0's reading decides for every rank
            if flag[0] is not None:
                pairs.append(flag[0])
            if len(pairs) == effort.contention_rounds:
                break
        pairs = pairs or [pair]
        solos, shared = [p[0] for p in pairs], [p[1] for p in pairs]
        out[cls] = {"solo_s": statistics.median(solos), "concurrent_s": statistics.median(shared),
                    "factor": statistics.median(c / s if s else 1.0 for s, c in pairs), "clock": clock.value}
    return out


def _background(ctx: Ctx, dtype: torch.dtype, shape: tuple[int, ...]) -> Callable[[], None]:
    """One training step's worth of a decoder layer at ``shape`` (``_compute_ops``): forward and backward."""
    b, s, h, f, heads, d = shape
    layer = ops.EagerLlamaLayer(h, heads, heads, f, d).to(device=ctx.device, dtype=dtype)
    x = torch.randn(b, s, h, device=ctx.device, dtype=dtype, requires_grad=True)
    cos, sin = ops.rope_tables(s, d, dtype, ctx.device)

    def step() -> None:
        layer(x, cos, sin).sum().backward()
        ctx.sync()
    return step


def _contention_pair(ctx: Ctx, fn: Callable[[], None], background: Callable[[], None],
                     window_s: float = CONTENTION_WINDOW_S, clock: Clock = Clock.WALL) -> tuple[float, float]:
    """(rank 0's time of ``fn`` alone, rank 0's time of ``fn`` while the other ranks run ``background``), s,
    by ``clock`` (``contention_clock``); each window lasts ``window_s`` of wall time.

    Rank 0 sets both windows' wall-clock instants before the first (one machine, one clock) and every rank
    sleeps until its turn: a rank waiting inside a gloo collective instead keeps a core busy, which made
    rank 0's "solo" GEMM 36 % slower than with the other process asleep."""
    box: list[Any] = [time.time() + 0.05]
    dist.broadcast_object_list(box, src=0)
    solo_start = box[0]
    shared_start = solo_start + window_s + 0.02
    shared_end = shared_start + window_s
    _sleep_until(solo_start)
    solo = _windowed(fn, ctx, solo_start + window_s, clock=clock.now) if ctx.rank == 0 else 0.0
    _sleep_until(shared_start)
    if ctx.rank == 0:
        return solo, _windowed(fn, ctx, shared_end, clock=clock.now)
    while time.time() < shared_end:
        background()
    return solo, 0.0


def _sleep_until(instant: float) -> None:
    while time.time() < instant:
        time.sleep(min(0.001, max(instant - time.time(), 0.0)))


def measure_interference(ctx: Ctx, dtype: torch.dtype, comm_bytes: int, ranks: tuple[int, ...],
                         effort: Effort = Effort(), shape: tuple[int, ...] = DEFAULT_WORK_SHAPE) -> dict[str, float]:
    """GEMM time with and without all-reduces of ``comm_bytes`` running beside it (every member of
    ``ranks``), and the all-reduce's own time alone and beside the GEMMs (as DDP's bucket all-reduces
    run beside the backward): ``slowdown`` of the compute, ``comm_slowdown`` of the collective.

    The GEMM is the run's MLP up-projection at ``shape`` (``_compute_ops``). Each round times the all-reduce
    alone, then the GEMMs on every rank for as long without it, then beside it; the slowdown is the median of
    the rounds' ratios (adjacent windows: a shared machine's drift cancels in each ratio), the GEMM time in a
    window its mean (the engine slows compute by a rate while a collective is in flight; a thread that takes
    turns with gloo's makes some GEMMs long and leaves others alone). One base window before all rounds and
    a 1024^3 GEMM, of which 1-3 ran beside each all-reduce, read slowdowns of 0.0 to 1.05 on one 2-vCPU
    machine in one hour (seven grid configurations, 2 ranks, 64 MiB)."""
    group = ctx.group(ranks)
    gemm = _compute_ops(ctx, dtype, shape)["gemm"]
    buf = torch.randn(comm_bytes // 4, device=ctx.device)
    dist.all_reduce(buf, group=group)
    gemm()
    dist.barrier(group=group)
    bases: list[float] = []
    withs: list[float] = []
    ratios: list[float] = []
    alone: list[float] = []
    beside: list[float] = []
    for _ in range(effort.interference_rounds):  # every rank issues the same number of all-reduces
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        ctx.sync()
        alone.append(time.perf_counter() - t0)
        dist.barrier(group=group)
        base = _windowed(gemm, ctx, time.time() + alone[-1], reduce=statistics.fmean)
        dist.barrier(group=group)
        t, comm_s = _gemms_beside_all_reduce(ctx, gemm, buf, group)
        beside.append(comm_s)
        if t == t and base == base and base > 0:
            bases.append(base)
            withs.append(t)
            ratios.append(t / base)
    res = torch.tensor([statistics.median(bases) if bases else float("nan"),
                        statistics.median(withs) if withs else float("nan"),
                        statistics.median(ratios) if ratios else 1.0,
                        statistics.median(alone), statistics.median(beside)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(res, op=dist.ReduceOp.MAX, group=group)
    b, w, ratio, c, cw = res.tolist()
    return {"gemm_s": b, "gemm_with_comm_s": w, "slowdown": max(ratio - 1.0, 0.0),
            "comm_s": c, "comm_with_gemm_s": cw, "comm_slowdown": max(cw / c - 1.0, 0.0)}


def _gemms_beside_all_reduce(ctx: Ctx, gemm: Callable[[], None], buf: torch.Tensor,
                             group: Any) -> tuple[float, float]:
    """(mean GEMM time, all-reduce time) of GEMMs run on this thread until an async all-reduce of ``buf``
    completes; a helper thread waits on it, so its end is timed to the wait, not to the GEMM that saw it."""
    finished: list[float] = []
    t0 = time.perf_counter()
    work = dist.all_reduce(buf, group=group, async_op=True)
    assert work is not None
    waiter = threading.Thread(target=lambda: (work.wait(), ctx.sync(), finished.append(time.perf_counter())))
    waiter.start()
    t = _windowed(gemm, ctx, time.time() + 60.0, during=lambda: not finished, reduce=statistics.fmean)
    waiter.join()
    return t, finished[0] - t0


def _pending(journal: Journal | None, plan: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    if journal is None:
        return []
    return [(k, p) for k, p in plan if not journal.has(measurement_key(k, p))]


def run(args: argparse.Namespace) -> int:
    """The body of one rank."""
    rank, world, local_rank, per_node = _env()
    if os.environ.get(FAIL_RANK_ENV) == str(rank):
        raise RuntimeError(f"injected failure on rank {rank} ({FAIL_RANK_ENV})")
    cuda = args.device == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(args.threads)
    dtype_name = args.dtype or ("bf16" if cuda else "fp32")
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout_s),
                            device_id=device if cuda else None)
    try:
        return _measure_all(args, rank, world, per_node, device, dtype, dtype_name)
    finally:
        dist.destroy_process_group()


def _measure_all(args: argparse.Namespace, rank: int, world: int, per_node: int, device: torch.device,
                 dtype: torch.dtype, dtype_name: str) -> int:
    ctx = Ctx(device, rank, world)
    effort = Effort.of(args.quick)
    folder = profile_folder(args.out)
    journal = None
    if rank == 0:
        desc = describe(device, dtype_name, args.threads if device.type == "cpu" else 1)
        journal = Journal(folder / JOURNAL_FILE, {"fingerprint": fingerprint(desc), "device": desc,
                                                  "software_stack": "eager_hf"}, fresh=args.fresh)
    plan = collective_plan(args, world, per_node)
    for ranks, _ in groups_to_measure(world, per_node):
        if len(ranks) < world:
            ctx.groups[ranks] = dist.new_group(list(ranks))
    box: list[Any] = [_pending(journal, plan)]
    dist.broadcast_object_list(box, src=0)
    todo: list[tuple[str, dict[str, Any]]] = box[0]
    if rank == 0:
        print(f"calibration.collectives: {world} ranks, {len(todo)} of {len(plan)} measurements to do", flush=True)
    for kind, params in todo:
        members = tuple(params["members"])
        if rank in members:
            stats = time_collective(CollectiveKind(params["collective"]), members, params["size_bytes"], ctx, effort)
            if journal is not None:
                journal.add(kind, params, "ok", stats)
        dist.barrier()
    if not args.no_compute_checks:
        _compute_checks(ctx, dtype, world, per_node, journal, device.type == "cpu", tuple(args.work_shape), effort)
    if journal is not None and not args.no_profile:
        fresh = Journal(folder / JOURNAL_FILE, journal.header)
        path = write_profile(folder, build_profile(folder.name, fresh.header, fresh.records()))
        print(f"calibration.collectives: profile written to {path}", flush=True)
    return 0


def compute_checks(world: int, per_node: int, cpu: bool, effort: Effort = Effort()) -> list[tuple[str, dict[str, Any]]]:
    """(kind, params) of the contention (CPU, one node) and interference (per node scope) measurements."""
    out: list[tuple[str, dict[str, Any]]] = []
    if cpu and world == per_node and world > 1:
        out += [("contention", {"processes": world, "op_class": c}) for c in ("attention", "gemm", "memory")]
    comm = effort.interference_cpu_bytes if cpu else 256 * MiB
    if per_node > 1:
        out.append(("interference", {"ranks": per_node, "nodes": 1, "comm_bytes": comm}))
    if world > per_node:
        out.append(("interference", {"ranks": world, "nodes": world // per_node, "comm_bytes": comm}))
    return out


def _compute_checks(ctx: Ctx, dtype: torch.dtype, world: int, per_node: int, journal: Journal | None,
                    cpu: bool, shape: tuple[int, ...] = DEFAULT_WORK_SHAPE, effort: Effort = Effort()) -> None:
    """Run the pending contention and interference measurements (rank 0 decides, everyone runs)."""
    box: list[Any] = [_pending(journal, compute_checks(world, per_node, cpu, effort))]
    dist.broadcast_object_list(box, src=0)
    todo: list[tuple[str, dict[str, Any]]] = box[0]
    if any(kind == "contention" for kind, _ in todo):
        for cls, res in measure_contention(ctx, dtype, shape, effort).items():
            if journal is not None:
                journal.add("contention", {"processes": world, "op_class": cls}, "ok", result=res)
    for kind, params in todo:
        if kind != "interference":
            continue
        ranks = tuple(range(params["ranks"]))
        if ctx.rank in ranks:
            res = measure_interference(ctx, dtype, params["comm_bytes"], ranks, effort, shape)
            if journal is not None:
                journal.add(kind, params, "ok", result=res)
        dist.barrier()


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank; exit code 0 on success, 1 (with the reason on stderr) on failure."""
    args = _parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        return run(args)
    except Exception as exc:  # noqa: BLE001 - report any failure of this rank as one clear line
        print(f"calibration.collectives: rank {rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
