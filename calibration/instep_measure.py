"""The torch part of ``calibration.instep``: training steps of the calibrated stack's Llama with the
target's dimensions (``realstep.build_model``: transformers' ``LlamaForCausalLM``, ``ops.EagerLlama``
without transformers), the embedding, LM head, loss and optimizer timed by the calling thread's clock
between hooks at their boundaries.

Why the stack's own model: which large tensors land on fresh pages depends on the order of the step's
allocations and frees (``calibration.instep``), and that order is the model code's. Measured on this
CPU (issue 29 part 5, thread CPU time, same minutes, fresh processes): the loss of ``l6-s128-v32k``
(256 x 32,000 fp32 logits, just under glibc's 32 MiB mmap ceiling) took 22-39 ms in ``EagerLlama``'s
steps and 56-69 ms in transformers' steps.

The step is timed plain, by a few clock reads from hooks (``calibration.instep``: a dispatch mode
around every op changes which tensors land on fresh pages); memory a kernel's region frees is
unmapped inside that region, and the gradients' release (``zero_grad(set_to_none=True)``: 10 ms of
a 1.3 s step for 4 layers, 256 tokens x 2, 32K vocabulary) is the optimizer's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from calibration.instep import book, kernel_seconds
from calibration.ops import EagerLlama
from calibration.realstep import build_model, step_loss
from calibration.shapes import Target
from calibration.timing import Clock, summarize


class _Booker(TorchDispatchMode):
    """Adds the time (the clock's: the calling thread's CPU time) of each aten op to the simtrain kernel
    ``book`` names. Used for the LM head's split into input and weight gradient only (``wgrad_share``)."""

    def __init__(self, vocab: int, now: Callable[[], float]):
        super().__init__()
        self.vocab, self.now = vocab, now
        self.phase = "fwd"
        self.seconds: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        t0 = self.now()
        out = func(*args, **(kwargs or {}))
        dt = self.now() - t0
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        kernel = book(self.phase, func.overloadpacket.__name__, shapes, self.vocab)
        if kernel is not None:
            self.seconds[kernel] += dt
        return out


def _head_modules(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The token embedding and the LM head of transformers' Llama or ``ops.EagerLlama``."""
    if isinstance(model, EagerLlama):
        return model.embed, model.head
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()  # transformers' PreTrainedModel
    assert isinstance(emb, nn.Module) and isinstance(head, nn.Module)
    return emb, head


class _Stamps:
    """Clock reads at ``instep.STAMPS`` of one step, from hooks on the embedding and the LM head."""

    def __init__(self, model: nn.Module, now: Callable[[], float]):
        self.now = now
        self.t: dict[str, float] = {}
        emb, head = _head_modules(model)
        emb.register_forward_hook(self._embedded)
        head.register_forward_pre_hook(self._head_in)
        head.register_forward_hook(self._logits)

    def mark(self, name: str) -> None:
        self.t[name] = self.now()

    def _on_grad(self, name: str) -> Callable[[torch.Tensor], None]:
        return lambda _grad: self.mark(name)

    def _embedded(self, _mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        self.mark("embedded")
        out.register_hook(self._on_grad("embedded_grad"))

    def _head_in(self, _mod: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
        self.mark("head_in")
        inp[0].register_hook(self._on_grad("head_grad"))

    def _logits(self, _mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        self.mark("logits")
        out.register_hook(self._on_grad("logits_grad"))


def wgrad_share(model: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, vocab: int,
                now: Callable[[], float], steps: int = 2) -> float:
    """The LM head weight gradient's share of its two backward GEMMs, timed per aten op (``_Booker``)
    in ``steps`` training steps; the median over the steps."""
    shares = []
    for _ in range(steps):
        booker = _Booker(vocab, now)
        with booker:
            loss = step_loss(model, ids)
            booker.phase = "bwd"
            loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)
        d, w = booker.seconds["lm_head.dgrad"], booker.seconds["lm_head.wgrad"]
        shares.append(w / (d + w) if d + w > 0 else 0.5)
    return statistics.median(shares)


#: Timed steps of ``measure_in_step`` per round: the kernels' medians, and the whole steps whose spread,
#: pooled over the calibration's rounds (three on a CPU), gives ``summary.step_jitter``
#: (``calibration.writer.step_jitter``)
STEPS = 11
#: ``--quick``'s (one round): the kernels' medians only, as before the step jitter (CI time)
QUICK_IN_STEP_STEPS = 5


def measure_in_step(target: Target, dtype: torch.dtype, clock: Clock = Clock.THREAD_CPU, steps: int = STEPS,
                    warmup: int = 2, device: torch.device | None = None) -> dict[str, Any]:
    """``kernels``: {simtrain kernel: Stats dict over the timed steps}, seconds of ``clock`` per step: the
    embedding, LM head and loss (forward and backward) and ``optimizer.step`` (``AdamW.step()`` and
    ``zero_grad``) of plain training steps, from the clock stamps of ``_Stamps``
    (``instep.kernel_seconds``); ``step_s``: each whole step's seconds (forward to ``zero_grad``)."""
    device = device or torch.device("cpu")
    m = target.model
    torch.manual_seed(1234)
    model, _ = build_model(m, dtype, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, m.vocab, (target.micro_batch_size, target.seq_len), device=device)
    stamps = _Stamps(model, clock.now)
    taken: list[dict[str, float]] = []
    for i in range(warmup + steps):
        stamps.t = {}
        stamps.mark("start")
        loss = step_loss(model, ids)
        stamps.mark("loss")
        loss.backward()
        stamps.mark("backward_end")
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)  # as HF Trainer and calibration.realstep
        stamps.mark("optimized")
        if i >= warmup:
            taken.append(dict(stamps.t))
    share = wgrad_share(model, opt, ids, m.vocab, clock.now)
    per_step: dict[str, list[float]] = defaultdict(list)
    for t in taken:
        for kernel, s in kernel_seconds(t, share).items():
            per_step[kernel].append(s)
    kernels = {k: summarize(v).to_dict() for k, v in sorted(per_step.items()) if statistics.median(v) > 0}
    return {"kernels": kernels, "step_s": [t["optimized"] - t["start"] for t in taken]}


def in_fresh_process(target: Target, dtype: str, clock: Clock, threads: int, timeout_s: float = 900.0,
                     steps: int = STEPS) -> dict[str, Any]:
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
    cmd = [sys.executable, "-m", "calibration.instep_measure", "--dtype", dtype, "--clock", clock.value,
           "--threads", str(threads), "--steps", str(steps)]
    proc = subprocess.run(cmd, input=spec, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"in-step measurement failed: {proc.stderr.strip()[-1000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def main(argv: list[str] | None = None) -> int:
    """Read a target (``Target.describe()`` plus ``model_spec``) as JSON on stdin, print the measurement as JSON."""
    p = argparse.ArgumentParser(prog="python -m calibration.instep_measure", description=main.__doc__)
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.THREAD_CPU.value)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=STEPS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = Target.from_header(json.loads(sys.stdin.read()))
    if target is None:
        print("calibration.instep_measure: no model_spec in the target", file=sys.stderr)
        return 2
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(json.dumps(measure_in_step(target, dtype, Clock(args.clock), steps=args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
