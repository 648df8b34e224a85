"""The kernels outside the decoder layers timed inside a training step, in the allocator state the
training loop runs them in (CPUs).

Why: on a CPU a kernel whose output lands on fresh pages pays a page fault and the kernel's zeroing
of each 4 KiB page on first touch. In a training loop the backward frees the step's activations,
glibc returns the top of the heap to the kernel once it exceeds its trim threshold (malloc(3),
M_TRIM_THRESHOLD; twice the dynamic mmap threshold, 32 MiB at most on 64-bit glibc), and the next
large tensors are fresh memory; a kernel repeated alone reuses the same warm block. Measured on this
CPU (issue 29 part 5, thread CPU time, a 256 x 32,000 fp32 tensor): the loss's forward 11 ms alone,
26 ms after ``malloc_trim(0)``, 26 ms inside a real transformers step; the LM head's weight-gradient
GEMM 50 ms alone, 64 ms after a trim, 69 ms in the step. Which large tensors are fresh depends on the
order of the step's allocations and frees (the LM head's forward read 57 ms in the step: its output
reused memory the optimizer had just freed), so no rule per kernel holds: they are measured in place.

How (``calibration.instep_measure``, the torch part; this module is torch-free for the writer):
the calibrated stack's Llama with the target's dimensions and layer count (``realstep.build_model``:
transformers' ``LlamaForCausalLM``, ``ops.EagerLlama`` without transformers; the allocation order is
the model code's) runs warm-up steps (forward, backward, ``AdamW.step()``,
``zero_grad(set_to_none=True)``, as HF Trainer and ``calibration.realstep`` do), then plain timed
steps in which a few clock reads (module hooks on the embedding and the LM head, gradient hooks on
their tensors) mark where each of those kernels starts and ends (``STAMPS``, ``kernel_seconds``).
Not a ``TorchDispatchMode`` around every aten op: measured on this CPU (issue 29 part 5, thread CPU
time, 8 layers, 512 tokens, 4K vocabulary), a step under such a mode ran the loss's forward in 6.9 ms
against 3.4 ms in the plain step, its backward in 11.4 against 4.4 ms, the LM head in 17.4 against
12.9 ms; the mode's ops faulted in fresh pages (7.0, 8.2 and 4.7 ms of system time) that the plain
step reuses (2 ms of system time per step): the Python around every op changes the allocator's state.
Only the LM head's split into input and weight gradients (one autograd node) comes from such a mode,
as a ratio, after the plain steps: GEMMs write small outputs and read the same there (12.4 + 13.7 ms
against 25.8 ms in the plain step). One thread per process: every op runs on the calling
thread (the CPU autograd engine runs the backward there too). The writer puts the medians over the
steps in place of the isolated timings of those kernels at the target's shape
(``calibration.writer``): LM-head GEMMs as points under the kernel name ``lm_head``, the loss and the
embedding as the target's point of their memory-op curves, the optimizer (``AdamW.step()`` and
``zero_grad``) as the target's point of its curve; the decoder layers keep their isolated kernels
times the in-situ factor (``calibration.insitu``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calibration.shapes import Target, memory_op_shapes, param_shapes
from simtrain.lower.kernels import Gemm, Sliced
from simtrain.lower.lowering import lower_program
from simtrain.lower.ops import ComputeOp

#: simtrain kernels measured in the step: LM-head GEMMs (by role) and memory-bound operations
IN_STEP_GEMMS = ("lm_head", "lm_head.dgrad", "lm_head.wgrad")
IN_STEP_MEMORY_OPS = ("cross_entropy", "cross_entropy.bwd", "embedding", "embedding.bwd", "optimizer.step")

# aten ops (overload packet names) of the loss and the embedding, as F.cross_entropy and F.embedding
# decompose on a CPU (cross_entropy_loss = log_softmax + nll_loss, aten/src/ATen/native/LossNLL.cpp)
_ATEN_KERNEL = {("fwd", "_log_softmax"): "cross_entropy", ("fwd", "nll_loss_forward"): "cross_entropy",
                ("bwd", "_log_softmax_backward_data"): "cross_entropy.bwd",
                ("bwd", "nll_loss_backward"): "cross_entropy.bwd",
                ("fwd", "embedding"): "embedding", ("bwd", "embedding_dense_backward"): "embedding.bwd"}


def book(phase: str, op: str, shapes: list[tuple[int, ...]], vocab: int) -> str | None:
    """The simtrain kernel an aten op of the step belongs to (None: not one measured here).

    ``phase`` is "fwd" or "bwd"; an ``mm`` is the LM head's when its output or inner dimension is
    the vocabulary: in the forward the logits, in the backward the input gradient (inner dimension
    the vocabulary) or else the weight gradient (autograd may compute it transposed,
    ``mm_mat2_backward`` in torch/csrc/autograd/FunctionsManual.cpp).
    """
    if op == "mm" and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (p, q), (_, r) = shapes[0], shapes[1]
        if phase == "fwd":
            return "lm_head" if r == vocab and q != vocab else None
        if q == vocab:
            return "lm_head.dgrad"
        return "lm_head.wgrad" if vocab in (p, r) else None
    return _ATEN_KERNEL.get((phase, op))


#: the clock stamps of one plain training step (``instep_measure``), in the order they are read
STAMPS = ("start", "embedded", "head_in", "logits", "loss", "logits_grad", "head_grad", "embedded_grad",
          "backward_end", "optimized")


def kernel_seconds(stamps: Mapping[str, float], wgrad_share: float) -> dict[str, float]:
    """simtrain kernel seconds of one training step from its clock stamps (``STAMPS``, seconds).

    The regions between stamps: the embedding from the step's start to the embedding's output (with
    the model's preamble), the LM head between its input and its logits, the loss from the logits to
    the returned loss (HF's ``ForCausalLMLoss``: shift, ``F.cross_entropy``); in the backward the
    loss's from its start to the logits' gradient, the LM head's to its input's gradient (split into
    the input and weight gradients by ``wgrad_share``, the weight gradient's share of the two
    GEMMs: autograd runs both in one node), the embedding's from its output's gradient to the end;
    and ``optimizer.step`` as ``AdamW.step()`` plus ``zero_grad(set_to_none=True)`` (the gradients'
    release, the optimizer phase of a training loop). Memory a region frees is unmapped inside it,
    so its system time is part of the region's.
    """
    d = {name: stamps[b] - stamps[a] for name, a, b in (
        ("embedding", "start", "embedded"), ("lm_head", "head_in", "logits"), ("cross_entropy", "logits", "loss"),
        ("cross_entropy.bwd", "loss", "logits_grad"), ("lm_head.bwd", "logits_grad", "head_grad"),
        ("embedding.bwd", "embedded_grad", "backward_end"), ("optimizer.step", "backward_end", "optimized"))}
    bwd = d.pop("lm_head.bwd")
    return {**d, "lm_head.dgrad": bwd * (1.0 - wgrad_share), "lm_head.wgrad": bwd * wgrad_share}


def in_step_applies(target: Target) -> bool:
    """Whether the in-step Llama (transformers' or ``ops.EagerLlama``) runs the target's step (SwiGLU,
    RMSNorm, RoPE, untied, one TP rank)."""
    m = target.model
    return (target.tp == 1 and m.activation == "swiglu" and m.norm == "rmsnorm" and not m.tied_embeddings
            and not m.linear_bias and m.position == "rope")


def lm_head_shapes(target: Target) -> dict[str, tuple[int, int, int]]:
    """simtrain's (m, n, k) of the LM head's GEMMs by kernel name (``lm_head``, ``.dgrad``, ``.wgrad``)."""
    out: dict[str, tuple[int, int, int]] = {}
    for prog in lower_program(target.run()).programs:
        for op in prog.ops:
            if isinstance(op, ComputeOp):
                for desc in op.kernels:
                    d = desc.of if isinstance(desc, Sliced) else desc
                    if isinstance(d, Gemm) and d.name in IN_STEP_GEMMS and d.batch == 1:
                        out.setdefault(d.name, (d.m, d.n, d.k))
    return out


def expand(record: dict[str, Any], target: Target, sim_bytes: dict[str, float]) -> list[dict[str, Any]]:
    """An ``in_step`` journal record as the gemm and memory_op records the profile is built from
    (``in_step: True`` in their params); ``sim_bytes`` is simtrain's byte count per memory-op kind at
    the target (``shapes.kernel_calls``)."""
    out: list[dict[str, Any]] = []
    kernels: dict[str, dict[str, Any]] = record.get("result", {}).get("kernels", {})
    rnd = record["params"].get("round", 0)
    gemms = lm_head_shapes(target)
    shapes = memory_op_shapes(target)
    for name, stats in kernels.items():
        base = {"key": f"{record['key']}/{name}", "status": "ok", "stats": stats, "t_unix": record.get("t_unix")}
        if name in gemms:
            mm, n, k = gemms[name]
            role = name.partition(".")[2] or "fwd"
            out.append({**base, "kind": "gemm", "params": {"kernel": "lm_head", "role": role, "m": mm, "n": n, "k": k,
                                                         "round": rnd, "in_step": True},
                        "flops": 2.0 * mm * n * k})
        elif name == "optimizer.step" and name in sim_bytes:
            out.append({**base, "kind": "optimizer", "sim_bytes": sim_bytes[name],
                        "params": {"layers": target.model.n_layers, "round": rnd, "in_step": True,
                                   "params": [list(p) for p in param_shapes(target.model, target.tp)]}})
        elif name in sim_bytes:
            out.append({**base, "kind": "memory_op",
                        "params": {"op": name, **shapes[name.removesuffix(".bwd")], "round": rnd, "in_step": True},
                        "sim_bytes": sim_bytes[name]})
    return out
