"""The torch part of ``calibration.instep``: training steps of the calibrated stack's Llama with the
target's dimensions (``realstep.build_model``: transformers' ``LlamaForCausalLM``, ``ops.EagerLlama``
without transformers), each aten op timed by the calling thread's clock and booked to simtrain's kernels.

Why the stack's own model: which large tensors land on fresh pages depends on the order of the step's
allocations and frees (``calibration.instep``), and that order is the model code's. Measured on this
CPU (issue 29 part 5, thread CPU time, same minutes, fresh processes): the loss of ``l6-s128-v32k``
(256 x 32,000 fp32 logits, just under glibc's 32 MiB mmap ceiling) took 22-39 ms in ``EagerLlama``'s
steps and 56-69 ms in transformers' steps.

Memory released outside any op: a tensor above glibc's mmap threshold is unmapped (``munmap``) when
its last reference goes (autograd releasing saved tensors, ``zero_grad(set_to_none=True)`` dropping
the gradients), which is kernel time on the thread but inside no aten op, so the dispatch mode books
none of it. Measured in transformers' steps (``getrusage(RUSAGE_THREAD)`` system time of the step
minus that inside aten ops): 48 ms of a 1.29 s step for 4 layers, 256 tokens x 2, 32K vocabulary
(3.7 %), 35 ms of 0.96 s for a 16K vocabulary (3.6 %), 0.2-2 ms for 4K vocabularies. The pages
unmapped are those the step's ops mapped fresh, so each booked kernel is charged that release time
in proportion to the system time of its own calls (its page faults); the share of the layers' ops
stays unbooked (the layers' tensors are mostly below the threshold).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from calibration.instep import book, charge_release
from calibration.realstep import build_model, step_loss
from calibration.shapes import Target
from calibration.timing import Clock, summarize


def _system_s() -> float:
    """System (kernel) CPU time of the calling thread so far, seconds (page faults, munmap)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_stime


class _Booker(TorchDispatchMode):
    """Adds the time (the clock's: the calling thread's CPU time) of each aten op to the simtrain kernel
    ``book`` names, and the system time of each op to ``system`` (by kernel, None for the others)."""

    def __init__(self, vocab: int, now: Callable[[], float]):
        super().__init__()
        self.vocab, self.now = vocab, now
        self.phase = "fwd"
        self.seconds: dict[str, float] = defaultdict(float)
        self.system: dict[str | None, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        s0 = _system_s()
        t0 = self.now()
        out = func(*args, **(kwargs or {}))
        dt = self.now() - t0
        ds = _system_s() - s0
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        kernel = book(self.phase, func.overloadpacket.__name__, shapes, self.vocab)
        if kernel is not None:
            self.seconds[kernel] += dt
        self.system[kernel] += ds
        return out

    def with_release(self, release_s: float) -> dict[str, float]:
        """The booked seconds plus their share of ``release_s`` (``instep.charge_release``)."""
        return charge_release(self.seconds, self.system, release_s)


def measure_in_step(target: Target, dtype: torch.dtype, clock: Clock = Clock.THREAD_CPU, steps: int = 5,
                    warmup: int = 2, device: torch.device | None = None) -> dict[str, dict[str, Any]]:
    """{simtrain kernel: Stats dict over the timed steps}, seconds of ``clock`` per step: the kernels
    outside the layers (a kernel's calls in one step summed) and ``optimizer.step``, the whole
    ``AdamW.step()`` (timed outside the dispatch mode, whose per-op work would count otherwise)."""
    device = device or torch.device("cpu")
    m = target.model
    torch.manual_seed(1234)
    model, _ = build_model(m, dtype, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, m.vocab, (target.micro_batch_size, target.seq_len), device=device)
    per_step: dict[str, list[float]] = defaultdict(list)
    for i in range(warmup + steps):
        booker = _Booker(m.vocab, clock.now)
        s0 = _system_s()
        with booker:
            loss = step_loss(model, ids)
            booker.phase = "bwd"
            loss.backward()
        del loss
        s1 = _system_s()
        t0 = clock.now()
        opt.step()
        t1 = clock.now()
        s2 = _system_s()
        opt.zero_grad(set_to_none=True)  # as HF Trainer and calibration.realstep
        # system time outside every op: the forward's and backward's releases, and zero_grad's
        release = (s1 - s0 - sum(booker.system.values())) + (_system_s() - s2)
        if i >= warmup:
            for kernel, s in {**booker.with_release(release), "optimizer.step": t1 - t0}.items():
                per_step[kernel].append(s)
    return {k: summarize(v).to_dict() for k, v in sorted(per_step.items()) if statistics.median(v) > 0}


def in_fresh_process(target: Target, dtype: str, clock: Clock, threads: int, timeout_s: float = 900.0,
                     ) -> dict[str, dict[str, Any]]:
    """``measure_in_step`` in a new Python process: the allocator state of a training process.

    Why a new process: glibc raises its mmap threshold to the size of each mmapped block freed (up
    to 32 MiB on 64-bit, and the trim threshold to twice that; malloc(3), M_MMAP_THRESHOLD), so the
    calibration's earlier benchmarks leave the heap keeping freed memory that a training process
    returns to the kernel. Measured on this CPU (issue 29 part 5, 2 layers, 1,024 tokens, 8K
    vocabulary, thread CPU time): ``AdamW.step()`` 88 ms in a fresh process's training loop, 59 ms
    in the same loop after one 30 MB tensor was allocated and freed first.
    """
    spec = json.dumps({"model_spec": target.model.model_dump(mode="json"), **target.describe()})
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-m", "calibration.instep_measure", "--dtype", dtype, "--clock", clock.value,
                           "--threads", str(threads)], input=spec, capture_output=True, text=True, timeout=timeout_s,
                          env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"in-step measurement failed: {proc.stderr.strip()[-1000:]}")
    out: dict[str, dict[str, Any]] = json.loads(proc.stdout)
    return out


def main(argv: list[str] | None = None) -> int:
    """Read a target (``Target.describe()`` plus ``model_spec``) as JSON on stdin, print the measurement as JSON."""
    p = argparse.ArgumentParser(prog="python -m calibration.instep_measure", description=main.__doc__)
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.THREAD_CPU.value)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = Target.from_header(json.loads(sys.stdin.read()))
    if target is None:
        print("calibration.instep_measure: no model_spec in the target", file=sys.stderr)
        return 2
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(json.dumps(measure_in_step(target, dtype, Clock(args.clock))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
