"""Single-device benchmarks: GEMMs, attention, memory-bound ops, optimizer, memory bandwidth, launch
overhead, and the memory of a layer step; the plan of what to measure; and the resumable runner.

Every benchmark uses ``torch.randn`` inputs (predictable data such as zeros runs faster and is not
what training sees: reference Table D, thonking.ai) in the device's compute dtype, and is timed by
``calibration.timing.DeviceTimer``. Backward benchmarks run the forward untimed before each timed
backward. Results go to the journal one by one (``calibration.journal``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from calibration import ops
from calibration.instep import in_step_applies
from calibration.instep_measure import QUICK_IN_STEP_STEPS, in_fresh_process
from calibration.instep_measure import STEPS as IN_STEP_STEPS
from calibration.journal import Journal, measurement_key
from calibration.saved import SavedTensorCounter
from calibration.shapes import (
    TOKEN_SCALES,
    Target,
    attention_grid,
    composite_parts,
    elements,
    gemm_grid,
    kernel_calls,
    memory_op_shapes,
    param_shapes,
    scaled,
)
from calibration.timing import DeviceTimer, OutOfMemory, Stats

KiB, MiB = 1024, 1024**2


@dataclass
class Context:
    """Where and how benchmarks run: device, compute dtype, timer."""

    device: torch.device
    dtype: torch.dtype
    timer: DeviceTimer

    def randn(self, *shape: int, grad: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=dtype or self.dtype, requires_grad=grad)


@dataclass(frozen=True)
class Measurement:
    """One planned measurement: its kind, parameters (the journal key) and derived facts."""

    kind: str
    params: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return measurement_key(self.kind, self.params)


# --------------------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------------------


def bench_gemm(ctx: Context, role: str, m: int, n: int, k: int, parts: Sequence[int] = ()) -> Stats:
    """One GEMM in the layout its role has in training (simtrain's (m, n, k) convention):

    fwd ``F.linear(X[m,k], W[n,k])`` with autograd recording; dgrad ``dY[m,k] @ W[k,n]``;
    wgrad ``dY[k,n]^T @ X[k,m]`` (the weight gradient dW[n,m] of a Linear, k = tokens).

    ``parts`` (a composite of ``shapes.COMPOSITE_GEMMS``) splits the Linear's output features into
    the Linears the stack runs instead (fwd: n; dgrad: k, with the input gradients summed as autograd
    does; wgrad: n): e.g. q, k, v projections for simtrain's fused QKV.
    """
    if not parts:
        parts = [k if role == "dgrad" else n]
    if role == "fwd":
        x, ws = ctx.randn(m, k, grad=True), [ctx.randn(p, k, grad=True) for p in parts]
        return ctx.timer.measure(lambda: [F.linear(x, w) for w in ws])
    if role == "dgrad":
        pairs = [(ctx.randn(m, p), ctx.randn(p, n)) for p in parts]
        return ctx.timer.measure(lambda: sum((torch.mm(a, b) for a, b in pairs[1:]), torch.mm(*pairs[0])))
    x, dys = ctx.randn(k, m), [ctx.randn(k, p) for p in parts]
    return ctx.timer.measure(lambda: [torch.mm(dy.t(), x) for dy in dys])


def _timed(ctx: Context, inputs: Sequence[torch.Tensor], forward: Callable[..., Any], backward: bool) -> Stats:
    """Time ``forward(*inputs)`` (autograd recording, as in training), or its backward alone.

    ``forward`` returns a tensor or a tuple of tensors; the backward gets random output gradients
    (none for a scalar loss).
    """
    if not backward:
        return ctx.timer.measure(lambda: forward(*inputs))
    state: dict[str, Any] = {}

    def setup() -> None:
        for t in inputs:
            t.grad = None
        out = forward(*inputs)
        outs = list(out) if isinstance(out, tuple) else [out]
        if "grads" not in state:
            state["grads"] = [torch.randn_like(o) if o.dim() else None for o in outs]
        state["outs"] = outs

    return ctx.timer.measure(lambda: torch.autograd.backward(state["outs"], state["grads"]), setup)


def bench_attention(ctx: Context, b: int, s_q: int, s_kv: int, heads: int, kv_heads: int, d: int, causal: bool,
                    backward: bool) -> Stats:
    """Causal SDPA on (b, s, heads, d) projections (``ops.attention``), forward or backward."""
    if not causal or s_q != s_kv:
        raise ValueError("only causal self-attention (s_q == s_kv) is benchmarked")
    q, k, v = ctx.randn(b, s_q, heads, d, grad=True), ctx.randn(b, s_kv, kv_heads, d, grad=True), \
        ctx.randn(b, s_kv, kv_heads, d, grad=True)
    return _timed(ctx, (q, k, v), ops.attention, backward)


def _memory_inputs(ctx: Context, kind: str, shape: dict[str, Any]) -> tuple[list[torch.Tensor], Callable[..., Any]]:
    """Inputs (leaf tensors) and forward function of one memory-bound operation."""
    base = kind.removesuffix(".bwd")
    if base == "norm":
        x, w = ctx.randn(shape["rows"], shape["cols"], grad=True), ctx.randn(shape["cols"], grad=True)
        return [x, w], lambda x, w: ops.norm(x, w, shape["norm"])
    if base == "residual":
        return [ctx.randn(shape["rows"], shape["cols"], grad=True) for _ in range(2)], torch.add
    if base == "act":
        n = 2 if shape["activation"] == "swiglu" else 1
        xs = [ctx.randn(shape["rows"], shape["cols"], grad=True) for _ in range(n)]
        return xs, lambda x, u=None: ops.activation(x, u, shape["activation"])
    if base == "rope":
        b, s, d = shape["b"], shape["s"], shape["d"]
        q, k = ctx.randn(b, shape["heads"], s, d, grad=True), ctx.randn(b, shape["kv_heads"], s, d, grad=True)
        cos, sin = ops.rope_tables(s, d, ctx.dtype, ctx.device)
        return [q, k], lambda q, k: ops.rope(q, k, cos, sin)
    if base == "cross_entropy":
        logits = ctx.randn(shape["rows"], shape["cols"], grad=True)
        target = torch.randint(0, shape["cols"], (shape["rows"],), device=ctx.device)
        return [logits], lambda x: ops.cross_entropy(x, target)
    if base == "embedding":
        table = ctx.randn(shape["vocab"], shape["cols"], grad=True)
        ids = torch.randint(0, shape["vocab"], (shape["rows"],), device=ctx.device)
        return [table], lambda w: F.embedding(ids, w)
    raise ValueError(f"unknown memory-bound operation {kind!r}")


def bench_memory_op(ctx: Context, kind: str, shape: dict[str, Any]) -> Stats:
    """A memory-bound operation (``norm``, ``act``, ``rope``, ``residual``, ``cross_entropy``,
    ``embedding``; ``.bwd`` for its backward) at ``shape``."""
    inputs, forward = _memory_inputs(ctx, kind, shape)
    return _timed(ctx, inputs, forward, kind.endswith(".bwd"))


def bench_layer_step(ctx: Context, target: Target, backward: bool) -> Stats:
    """A whole eager Llama layer (``ops.EagerLlamaLayer``) at the target's per-rank shape, forward
    (with autograd recording) or backward: the in-situ reference for the sum of its kernels."""
    m, t = target.model, target.tp
    layer = ops.EagerLlamaLayer(m.hidden, max(m.n_heads // t, 1), max(m.kv_heads // t, 1), m.ffn_hidden // t,
                                m.d_head).to(device=ctx.device, dtype=ctx.dtype)
    x = ctx.randn(target.micro_batch_size, target.seq_len, m.hidden, grad=True)
    cos, sin = ops.rope_tables(target.seq_len, m.d_head, ctx.dtype, ctx.device)
    return _timed(ctx, [x], lambda x: layer(x, cos, sin), backward)


def bench_optimizer(ctx: Context, shapes: list[list[int]]) -> Stats:
    """One ``torch.optim.AdamW.step()`` (library defaults) over parameters of these shapes."""
    params = [torch.nn.Parameter(ctx.randn(*s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)
    return ctx.timer.measure(opt.step)


def optimizer_in_situ(target: Target) -> bool:
    """Whether the optimizer is timed after a training step (``bench_optimizer_after_step``): an
    ``ops.EagerLlama`` of the target's own parameters (SwiGLU, RMSNorm, untied, one TP rank)."""
    m = target.model
    return (target.tp == 1 and m.activation == "swiglu" and m.norm == "rmsnorm" and not m.tied_embeddings
            and not m.linear_bias)


def bench_optimizer_after_step(ctx: Context, target: Target, layers: int) -> Stats:
    """``AdamW.step()`` over an ``ops.EagerLlama`` with ``layers`` layers at the target's dims, each
    timed step right after that model's forward and backward (untimed), as a training loop runs it.

    On a CPU the optimizer's temporaries (``exp_avg_sq.sqrt()`` and the like: one parameter-sized
    tensor each) land on fresh pages after the step's activations were freed (glibc returns freed
    memory above its trim threshold to the kernel, malloc(3) M_TRIM_THRESHOLD), while ``opt.step()``
    repeated alone reuses warm memory: measured on this CPU (issue 29 part 5, 2 layers, 1,024 tokens,
    8K vocabulary, thread CPU time) 72 ms inside the training loop against 44 ms alone, and 54 ms in
    the loop with glibc told never to trim or map (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_).
    """
    m = target.model
    model = ops.EagerLlama(m.vocab, m.hidden, layers, m.n_heads, m.kv_heads, m.ffn_hidden, m.d_head)
    model = model.to(device=ctx.device, dtype=ctx.dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, m.vocab, (target.micro_batch_size, target.seq_len), device=ctx.device)

    def forward_backward() -> None:
        opt.zero_grad(set_to_none=True)
        model(ids).backward()

    return ctx.timer.measure(opt.step, forward_backward)


def bench_copy(ctx: Context, nbytes: int) -> Stats:
    """A device-to-device copy of ``nbytes`` (memory bandwidth: 2 x nbytes moved)."""
    src = torch.randn(nbytes // 4, device=ctx.device)
    dst = torch.empty_like(src)
    return ctx.timer.measure(lambda: dst.copy_(src))


def bench_host_copy(ctx: Context, nbytes: int, direction: str) -> Stats:
    """A copy of ``nbytes`` between device memory and pinned host memory (``d2h`` or ``h2d``), as CPU
    activation offloading moves saved tensors (Transformer Engine copies into pinned buffers,
    non-blocking, on copy engines). On a CPU device host and device are the same memory: a memcpy."""
    src = torch.randn(nbytes // 4, device=ctx.device)
    pin = ctx.device.type == "cuda"
    host = torch.empty(nbytes // 4, pin_memory=pin)
    if direction == "d2h":
        return ctx.timer.measure(lambda: host.copy_(src, non_blocking=pin))
    return ctx.timer.measure(lambda: src.copy_(host, non_blocking=pin))


def bench_launch(ctx: Context) -> Stats:
    """The smallest op (an in-place add on one element): the per-op launch/dispatch floor."""
    x = torch.zeros(1, device=ctx.device)
    return ctx.timer.measure(lambda: x.add_(1.0))


def layer_memory(ctx: Context, target: Target) -> dict[str, float]:
    """Memory of one layer step (forward + backward) of an eager Llama layer at the target's per-rank shape.

    GPU: activations kept after forward, the step's peak above the inputs, reserved, and the context
    (device memory in use outside PyTorch's allocator), bytes. CPU: the bytes autograd saves for
    backward (unique storages, parameters excluded), the quantity ``simtrain.lower.memory`` models.
    """
    m, t = target.model, target.tp
    layer = ops.EagerLlamaLayer(m.hidden, max(m.n_heads // t, 1), max(m.kv_heads // t, 1), m.ffn_hidden // t,
                                m.d_head).to(device=ctx.device, dtype=ctx.dtype)
    b, s = target.micro_batch_size, target.seq_len
    x = ctx.randn(b, s, m.hidden, grad=True)
    cos, sin = ops.rope_tables(s, m.d_head, ctx.dtype, ctx.device)
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    with SavedTensorCounter(layer, {"layer": layer}) as counter:
        out = layer(x, cos, sin)
    after = torch.cuda.memory_allocated() if cuda else 0
    out.backward(torch.randn_like(out))
    res = {"saved_bytes": float(counter.bytes["layer"])}
    if cuda:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        res.update(activation_bytes=float(after - before), peak_bytes=float(torch.cuda.max_memory_allocated() - before),
                   reserved_bytes=float(reserved), context_bytes=float(total - free - reserved))
    return res


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanSettings:
    """Grid sizes of one device class, and how many rounds the target's own kernels are measured in."""

    gemm_sizes: tuple[int, ...]
    copy_bytes: tuple[int, ...]
    rounds: int = 1
    optimizer_after_step: bool = False  # time the optimizer, LM head, loss and embedding in a training step (CPUs)
    in_step_steps: int = IN_STEP_STEPS
    """Timed training steps per round of the in-step measurement (``calibration.instep_measure``); the
    whole steps' spread needs ``calibration.writer.MIN_JITTER_STEPS`` pooled, so ``--quick`` (one round
    of 5) measures no step jitter."""

    @classmethod
    def for_device(cls, kind: str, quick: bool = False) -> PlanSettings:
        """GPUs: 1 MiB .. 1 GiB copies, GEMM grid to 16384, one round (their timings are steady).
        CPUs: smaller grids and three rounds (shared cores make single windows unreliable), the
        optimizer timed after a training step's forward and backward (``bench_optimizer_after_step``)
        and the LM head, loss and embedding inside training steps (``calibration.instep``)."""
        if kind == "cuda":
            return cls((256, 1024, 4096) if quick else (256, 1024, 4096, 16384),
                       tuple(MiB * 4**i for i in range(4 if quick else 6)), 1)
        return cls((128, 512) if quick else (128, 512, 2048), tuple(MiB * 4**i for i in range(3 if quick else 4)),
                   1 if quick else 3, optimizer_after_step=True,
                   in_step_steps=QUICK_IN_STEP_STEPS if quick else IN_STEP_STEPS)


def compute_plan(target: Target, settings: PlanSettings) -> list[Measurement]:
    """Every single-device measurement for ``target``: its exact kernels (``settings.rounds`` times,
    spread over the run so a passing disturbance of the machine hits one round, not the median)
    plus the grids around them (once)."""
    calls = kernel_calls(target)
    exact: list[Measurement] = [Measurement("launch", {})]
    for kernel, r, m, n, k in sorted(calls.gemms):
        parts = composite_parts(kernel, target.model, target.tp) if kernel else []
        params = {"kernel": kernel if parts else "", "role": r, "m": m, "n": n, "k": k}
        exact.append(Measurement("gemm", {**params, "parts": parts} if parts else params, {"flops": 2.0 * m * n * k}))
    exact += [_attention(key) for key in sorted(calls.attention)]
    exact += [Measurement("layer_step", {"pass": p, **target.describe()}) for p in ("fwd", "bwd")]
    in_step = settings.optimizer_after_step and in_step_applies(target)
    if in_step:
        exact.append(Measurement("in_step", target.describe(), {"steps": settings.in_step_steps}))
    memory = list(_memory_plan(target, calls.memory_bytes, settings.optimizer_after_step, in_step))
    exact += [m for m in memory if m.extra["at_target"]]
    grid = [m for m in memory if not m.extra["at_target"]]
    grid += [Measurement("copy", {"bytes": b}, {"moved_bytes": 2 * b}) for b in settings.copy_bytes]
    grid += [Measurement("host_copy", {"bytes": settings.copy_bytes[-1], "direction": d},
                         {"moved_bytes": settings.copy_bytes[-1]}) for d in ("d2h", "h2d")]
    plain = {(r, m, n, k) for kernel, r, m, n, k in calls.gemms if not kernel}
    grid += [Measurement("gemm", {"kernel": "", "role": r, "m": m, "n": n, "k": k}, {"flops": 2.0 * m * n * k})
             for _, r, m, n, k in gemm_grid(settings.gemm_sizes) if (r, m, n, k) not in plain]
    grid += [_attention(key) for key in attention_grid(calls)]
    plan = [_round(m, 0) for m in exact + grid]
    plan += [_round(m, i) for i in range(1, settings.rounds) for m in exact]
    plan.append(Measurement("layer_memory", target.describe()))
    return plan


def _round(meas: Measurement, i: int) -> Measurement:
    return Measurement(meas.kind, {**meas.params, "round": i}, meas.extra)


def _attention(key: tuple[int, int, int, int, int, int, bool, bool]) -> Measurement:
    b, s_q, s_kv, a, g, d, causal, bwd = key
    fwd_flops = 4.0 * b * s_q * s_kv * a * d * (0.5 if causal else 1.0)  # simtrain costs.flash_attention
    params = dict(zip(("b", "s_q", "s_kv", "heads", "kv_heads", "d", "causal", "backward"), key, strict=True))
    return Measurement("attention", params, {"flops": 2.5 * fwd_flops if bwd else fwd_flops})


def _memory_plan(target: Target, sim_bytes: dict[str, float], in_situ_optimizer: bool,
                 in_step: bool = False) -> Iterable[Measurement]:
    """Memory-bound ops at the target's shape and at other token counts; ``sim_bytes`` is what
    simtrain's kernel moves at the target, so each measurement knows its simtrain byte count. With
    ``in_step`` the optimizer of the whole model is timed by the ``in_step`` measurement instead."""
    for base, shape in memory_op_shapes(target).items():
        for kind in (base, f"{base}.bwd"):
            if kind not in sim_bytes:
                continue  # simtrain has no such kernel (e.g. the residual's backward is free)
            per_element = sim_bytes[kind] / elements(kind, shape)
            for f in TOKEN_SCALES:
                sh = scaled(kind, shape, f)
                yield Measurement("memory_op", {"op": kind, **sh}, {"sim_bytes": per_element * elements(kind, sh),
                                                                   "at_target": f == 1.0})
    if "optimizer.step" in sim_bytes:
        full = [list(p) for p in param_shapes(target.model, target.tp)]
        per_param = sim_bytes["optimizer.step"] / elements("optimizer.step", {"params": full})
        after_step = {"after_step": True} if in_situ_optimizer and optimizer_in_situ(target) else {}
        for layers in sorted({1} if in_step else {1, target.model.n_layers}):
            shapes = [list(p) for p in param_shapes(target.model, target.tp, layers)]
            yield Measurement("optimizer", {"layers": layers, "params": shapes, **after_step},
                              {"sim_bytes": per_param * elements("optimizer.step", {"params": shapes}),
                               "at_target": layers == target.model.n_layers})


def run_measurement(ctx: Context, meas: Measurement, target: Target) -> tuple[Stats | None, dict[str, Any]]:
    """Run one measurement; returns its timing (None for memory measurements) and extra results."""
    p, kind = meas.params, meas.kind
    if kind == "launch":
        return bench_launch(ctx), {}
    if kind == "copy":
        return bench_copy(ctx, p["bytes"]), {}
    if kind == "host_copy":
        return bench_host_copy(ctx, p["bytes"], p["direction"]), {}
    if kind == "gemm":
        return bench_gemm(ctx, p["role"], p["m"], p["n"], p["k"], p.get("parts", ())), {}
    if kind == "attention":
        return bench_attention(ctx, **{k: v for k, v in p.items() if k != "round"}), {}
    if kind == "memory_op":
        shape = {k: v for k, v in p.items() if k not in ("op", "round")}
        return bench_memory_op(ctx, p["op"], shape), {}
    if kind == "optimizer":
        if p.get("after_step"):
            return bench_optimizer_after_step(ctx, target, p["layers"]), {}
        return bench_optimizer(ctx, p["params"]), {}
    if kind == "layer_step":
        return bench_layer_step(ctx, target, p["pass"] == "bwd"), {}
    if kind == "in_step":
        return None, in_fresh_process(target, _DTYPE_NAMES[ctx.dtype], ctx.timer.settings.clock, torch.get_num_threads(),
                                      steps=int(meas.extra.get("steps", IN_STEP_STEPS)))
    if kind == "layer_memory":
        return None, layer_memory(ctx, target)
    raise ValueError(f"unknown measurement kind {kind!r}")


def pending_of(plan: list[Measurement], journal: Journal) -> list[Measurement]:
    """The measurements of ``plan`` not yet in the journal (what a resumed run still has to do)."""
    return [m for m in plan if not journal.has(m.key)]


def run_plan(ctx: Context, plan: list[Measurement], target: Target, journal: Journal,
             log: Callable[[str], None], advance: Callable[[], None] | None = None) -> dict[str, int]:
    """Run every measurement not yet in the journal, appending each result as it is measured;
    ``advance`` is called after each (the progress display).

    Out-of-memory shapes are recorded with status "oom" and skipped; a benchmark that fails
    otherwise is recorded as "error" with its message. Returns counts by status (plus "skipped").
    """
    counts = {"ok": 0, "oom": 0, "error": 0, "skipped": 0}
    pending = pending_of(plan, journal)
    counts["skipped"] = len(plan) - len(pending)
    if counts["skipped"]:
        log(f"resuming: {counts['skipped']} of {len(plan)} measurements already in {journal.path}")
    for i, meas in enumerate(pending):
        counts[_run_one(ctx, meas, target, journal, log)] += 1
        if advance is not None:
            advance()
        if (i + 1) % 25 == 0:
            log(f"  {i + 1}/{len(pending)} measured")
    return counts


def _run_one(ctx: Context, meas: Measurement, target: Target, journal: Journal, log: Callable[[str], None]) -> str:
    """Run one measurement and journal it; returns its status ("ok", "oom" or "error")."""
    try:
        stats, result = run_measurement(ctx, meas, target)
    except OutOfMemory as exc:
        journal.add(meas.kind, meas.params, "oom", message=str(exc), **meas.extra)
        log(f"  out of memory, skipped: {meas.kind} {meas.params}")
        return "oom"
    except (RuntimeError, ValueError, TypeError) as exc:
        journal.add(meas.kind, meas.params, "error", message=traceback.format_exception_only(exc)[-1].strip(),
                    **meas.extra)
        log(f"  failed, skipped: {meas.kind} {meas.params}: {exc}")
        return "error"
    journal.add(meas.kind, meas.params, "ok", stats.to_dict() if stats else None, result=result, **meas.extra)
    return "ok"


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


def dtype_of(name: str) -> torch.dtype:
    """torch dtype of "fp32", "bf16" or "fp16"."""
    return _DTYPES[name]
