"""A real training step to compare simtrain's prediction with: Hugging Face transformers' Llama.

The model code is transformers' ``LlamaForCausalLM`` (SDPA attention) built from a small config with
the dims of a simtrain ``ModelSpec`` and randomly initialised (no weights are downloaded); simtrain's
own code plays no part in it. One step = forward with the causal-LM loss, backward, ``AdamW.step()``
and ``zero_grad()``, as a plain training loop runs it. With ``--ddp`` the model is wrapped in
``DistributedDataParallel`` (gloo on a CPU, NCCL on GPUs; default 25 MiB buckets) and a step's time
is the slowest rank's. Without transformers, ``calibration.ops.EagerLlama`` stands in (said in the
result's ``implementation``).

    python -m calibration.realstep --model-json spec.json --seq-len 256 --micro-batch-size 2 --out result.json
    (DDP: started as ranks by ``calibration.launch.launch_local(..., module="calibration.realstep")``)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from calibration.ops import EagerLlama
from simtrain.engine.trace import write_atomic
from simtrain.spec.model import ModelSpec


def build_model(spec: ModelSpec, dtype: torch.dtype, device: torch.device) -> tuple[nn.Module, str]:
    """transformers' LlamaForCausalLM for ``spec`` (or ``EagerLlama`` without transformers) and its name."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        model: nn.Module = EagerLlama(spec.vocab, spec.hidden, spec.n_layers, spec.n_heads, spec.kv_heads,
                                      spec.ffn_hidden, spec.d_head)
        return model.to(device=device, dtype=dtype), "calibration.ops.EagerLlama"
    cfg = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
                      num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                      num_key_value_heads=spec.kv_heads, head_dim=spec.d_head,
                      max_position_embeddings=spec.max_position, tie_word_embeddings=spec.tied_embeddings,
                      attention_bias=False, mlp_bias=False, use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype), "transformers.LlamaForCausalLM"


def step_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss of one micro-batch (labels = inputs, shifted by the model as HF does)."""
    out = model(input_ids=ids, labels=ids) if not isinstance(_unwrap(model), EagerLlama) else model(ids)
    return out if isinstance(out, torch.Tensor) else out.loss


def _unwrap(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", model)
    return inner if isinstance(inner, nn.Module) else model


def train_steps(spec: ModelSpec, seq_len: int, micro_batch_size: int, steps: int, warmup: int, device: torch.device,
                dtype: torch.dtype, ddp: bool = False) -> dict[str, Any]:
    """Run ``warmup + steps`` training steps; returns the timed steps (seconds) and memory facts.

    Call inside an initialised process group when ``ddp``.
    """
    torch.manual_seed(1234 + (dist.get_rank() if ddp else 0))
    model, impl = build_model(spec, dtype, device)
    model.train()
    if ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, spec.vocab, (micro_batch_size, seq_len), device=device)
    cuda = device.type == "cuda"
    times, cpu_times, proc_times = [], [], []
    for i in range(warmup + steps):
        if ddp:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            if i == warmup:
                torch.cuda.reset_peak_memory_stats()
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        step_loss(model, ids).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.thread_time() - c0)
        proc_times.append(time.process_time() - p0)
    timed = torch.tensor(times[warmup:], dtype=torch.float64, device=device)
    # the share of the step's wall time this process ran (all threads): below 1 on a CPU shared with other
    # processes (or waiting on a peer); per step, the lowest over the ranks
    share = torch.tensor([p / w for p, w in zip(proc_times[warmup:], times[warmup:], strict=True)],
                         dtype=torch.float64, device=device)
    if ddp:
        dist.all_reduce(timed, op=dist.ReduceOp.MAX)
        dist.all_reduce(share, op=dist.ReduceOp.MIN)
    step_times = timed.tolist()
    out = {"implementation": impl, "step_times_s": step_times, "median_s": statistics.median(step_times),
           # the main thread's CPU time per step (calibration.timing.Clock.THREAD_CPU), rank 0's: with one
           # thread and one process, the step's time without the time other processes held the core
           "cpu_step_times_s": cpu_times[warmup:], "cpu_share": share.tolist(),
           "params": sum(p.numel() for p in model.parameters()), "world_size": dist.get_world_size() if ddp else 1,
           "threads": torch.get_num_threads()}
    if cuda:
        out["peak_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
        out["peak_reserved_bytes"] = float(torch.cuda.max_memory_reserved())
    return out


def step_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments every real step takes: the model, its batch, the timed and warm-up steps, threads, the
    process group's timeout and where rank 0 writes the result."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--model-json", required=True, help="a simtrain ModelSpec as JSON (ModelSpec.model_dump)")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--out", required=True, help="where rank 0 writes the JSON result")
    return p


def _parser() -> argparse.ArgumentParser:
    p = step_parser("python -m calibration.realstep", __doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--ddp", action="store_true", help="run as one rank of a DDP group (torchrun environment)")
    return p


def main(argv: list[str] | None = None) -> int:
    """One process (or one DDP rank) of the real step; rank 0 writes the result JSON."""
    args = _parser().parse_args(argv)
    spec = ModelSpec.model_validate(json.loads(Path(args.model_json).read_text()))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    return run_rank("calibration.realstep", args.out, args.timeout_s, device, args.ddp,
                    lambda: train_steps(spec, args.seq_len, args.micro_batch_size, args.steps, args.warmup, device,
                                        dtype, args.ddp))


def run_rank(module: str, out: str, timeout_s: float, device: torch.device, group: bool,
             work: Callable[[], dict[str, Any]]) -> int:
    """Run ``work`` as this process's part of a real step: inside a process group (NCCL on GPUs, gloo on a
    CPU) when ``group``; rank 0 writes its result to ``out`` (JSON, atomically). A failure is one clear
    line on stderr naming ``module`` and the rank, and exit status 1; the group is left either way."""
    ok = False
    try:
        if group:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(seconds=timeout_s))
        res = work()
        if not group or dist.get_rank() == 0:
            write_atomic(out, json.dumps(res, indent=2))
        ok = True
    except Exception as exc:  # noqa: BLE001 - one clear line per failed rank
        print(f"{module}: rank {os.environ.get('RANK', '0')} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        if group and dist.is_initialized():
            _shutdown(together=ok)
    return 0


def _shutdown(together: bool) -> None:
    """Leave the process group. After a successful run the ranks meet at a barrier first: a rank tearing
    gloo down while its peer still talks to it can abort ("terminate called without an active
    exception"; gloo worker threads outliving their work, pytorch/pytorch#179291). After a failure
    there is no barrier (the peer may be stuck in another collective)."""
    if together:
        with contextlib.suppress(RuntimeError):
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
