"""Each DDP gradient bucket's all-reduce inside real training steps, against the same size alone.

Two processes over gloo, one thread each, train transformers' Llama at a CPU-loop config's dims (as
``calibration.realstep`` builds it) under ``DistributedDataParallel`` with its default buckets. A comm hook
(the default all-reduce, timed) records when each bucket's all-reduce starts and ends within the step;
after the steps, the same sizes are all-reduced with nothing else running. A bucket whose all-reduce runs
beside the backward takes longer than alone (gloo's thread shares the cores with the compute); the last
bucket, which the backward's end waits for, runs with the cores otherwise idle. Not a test: it prints a
line per step and exits 0.

    python benchmarks/ddp_buckets.py tests/calibration/data/grid/l8-s128-v4k.yaml --steps 5

Measured 2026-12-07 (this 2-vCPU VM, on a host busier than in the morning: real steps 5-30 % slower):
``l8-s128-v4k`` (buckets of 4.2 MB, the LM head alone in torch's 1 MiB first bucket, and 27.8 MB): the
first 17-30 ms beside the backward against 4.3 ms alone, the last 23-28 ms against 24.6 ms alone (a later
run: 10-44 ms against 4.6 ms, and 30-103 ms against 23.6 ms); ``l2-s1024-v8k`` (16.8 and 39.3 MB): the
first 25-32 ms against 12.6 ms, the last 35-49 ms against 37.4 ms (one step 255 and 264 ms);
``l4-s256-v32k`` (50.3 and 76.3 MB): the first 66-161 ms against 56.2 ms, the last 78-99 ms against 71.9 ms
(one step 489 and 484 ms). So the last bucket ran at 1.0-1.4x its time alone in most steps, where
simtrain stretched it by the profile's in-situ factor (1.8-2.2x) until 2026-12-07.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2
ALONE_REPEATS = 7


def _rank(rank: int, config: str, steps: int, port: int, queue: Any) -> None:
    sys.path.insert(0, str(ROOT))
    from calibration.realstep import build_model, step_loss
    from simtrain.spec.model import ModelSpec

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    raw = yaml.safe_load(Path(config).read_text())
    spec = ModelSpec.model_validate(raw["model"])
    torch.manual_seed(1234 + rank)
    model, _ = build_model(spec, torch.float32, torch.device("cpu"))
    ddp = nn.parallel.DistributedDataParallel(model)
    spans: list[tuple[int, int, float, float]] = []

    # no annotations: DDP checks a hook's parameters against dist.GradBucket, and these would be strings
    def timed_all_reduce(_, bucket):  # type: ignore[no-untyped-def]
        start, buf = time.perf_counter(), bucket.buffer()
        fut = dist.all_reduce(buf.div_(2), async_op=True).get_future()  # type: ignore[union-attr]

        def ended(f):  # type: ignore[no-untyped-def]
            spans.append((bucket.index(), buf.numel() * buf.element_size(), start, time.perf_counter()))
            return f.value()[0]
        return fut.then(ended)

    ddp.register_comm_hook(None, timed_all_reduce)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    ids = torch.randint(0, spec.vocab, (raw["train"]["micro_batch_size"], raw["train"]["seq_len"]))
    steps_out = []
    for i in range(WARMUP + steps):
        dist.barrier()
        spans.clear()
        t0 = time.perf_counter()
        step_loss(ddp, ids).backward()
        t_bwd = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= WARMUP:
            steps_out.append({"backward_end_s": t_bwd - t0, "step_s": time.perf_counter() - t0,
                              "buckets": [(b, n, s - t0, e - t0) for b, n, s, e in sorted(spans)]})
    alone = {}
    for size in sorted({n for s in steps_out for _, n, _, _ in s["buckets"]}):
        x, times = torch.ones(size // 4), []
        for _ in range(ALONE_REPEATS):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t)
        alone[size] = statistics.median(times[2:])
    if rank == 0:
        queue.put({"steps": steps_out, "alone": alone})
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/ddp_buckets.py", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a CPU-loop config (tests/calibration/data/grid/*.yaml, cpu_llama.yaml)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--port", type=int, default=29611)
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank, args=(r, args.config, args.steps, args.port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    res = queue.get()
    for proc in procs:
        proc.join()
    print("alone: " + ", ".join(f"{n / 1e6:.1f} MB {t * 1e3:.1f} ms" for n, t in res["alone"].items()))
    for s in res["steps"]:
        buckets = "; ".join(f"bucket {b} {n / 1e6:.1f} MB {a * 1e3:.0f}-{e * 1e3:.0f} ms ({(e - a) * 1e3:.0f} ms)"
                            for b, n, a, e in s["buckets"])
        print(f"step {s['step_s'] * 1e3:.0f} ms, backward ends {s['backward_end_s'] * 1e3:.0f} ms: {buckets}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
