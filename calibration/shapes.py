"""What to measure: the exact kernels a model and layout produce, enumerated by simtrain itself.

``kernel_calls`` lowers the run with simtrain's own lowering (``simtrain.lower.lowering.lower_program``) and
reads the kernel descriptors of the program (no times needed), so the GEMM shapes (forward, input-grad, weight-grad of every projection and
the LM head), the attention shapes and the byte counts of the memory-bound kernels are exactly the
ones simtrain will later ask the calibrated profile about. Grids of other shapes are added around
them so the fitted functions also cover runs the profile was not made for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simtrain.hardware.calibrated import gemm_role, memory_op_kind
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.kernels import Attention, Gemm, KernelDesc, MemoryBound, Sliced
from simtrain.lower.lowering import lower_program
from simtrain.lower.ops import ComputeOp
from simtrain.spec.config import LayoutConfig, RunConfig, TrainConfig, read_config_file
from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.model import ModelSpec, preset

#: The model the CPU loop calibrates for by default: a Llama-style decoder small enough that a
#: training step takes a fraction of a second on one core (16.8M parameters).
CPU_DEFAULT_MODEL = ModelSpec(name="llama-cpu-16m", n_layers=4, hidden=512, n_heads=8, n_kv_heads=4, ffn_hidden=1536,
                              activation="swiglu", norm="rmsnorm", position="rope", vocab=4096, max_position=2048,
                              tied_embeddings=False, linear_bias=False)

TOKEN_SCALES = (0.25, 1.0, 4.0)  # memory-bound ops are measured at these multiples of the run's tokens


@dataclass(frozen=True, slots=True)
class Target:
    """The run a calibration is made for: model, TP degree, sequence parallelism, batch shape."""

    model: ModelSpec
    tp: int = 1
    sp: bool = False
    seq_len: int = 4096
    micro_batch_size: int = 1

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch (b * s)."""
        return self.seq_len * self.micro_batch_size

    def run(self) -> RunConfig:
        """A RunConfig of this target (one pipeline stage, one data-parallel rank) for lowering."""
        return RunConfig(model=self.model, layout=LayoutConfig(tp=self.tp, sequence_parallel=self.sp),
                         train=TrainConfig(seq_len=self.seq_len, micro_batch_size=self.micro_batch_size,
                                           global_batch_seqs=self.micro_batch_size))

    def describe(self) -> dict[str, Any]:
        """JSON-safe description for the profile's ``calibrated_for``."""
        return {"model": self.model.name, "tp": self.tp, "sequence_parallel": self.sp, "seq_len": self.seq_len,
                "micro_batch_size": self.micro_batch_size}

    @classmethod
    def from_header(cls, data: dict[str, Any]) -> Target | None:
        """The target a journal header's ``calibrated_for`` (with ``model_spec``) describes, if any."""
        spec = data.get("model_spec")
        if not spec:
            return None
        return cls(ModelSpec.model_validate(spec), data["tp"], data["sequence_parallel"], data["seq_len"],
                   data["micro_batch_size"])


def parse_layout(text: str) -> dict[str, Any]:
    """Parse ``"tp=2,sp=true"`` (comma or space separated) into {"tp": 2, "sp": True}.

    Raises:
        ConfigError: unknown keys or bad values, at ``--layout``.
    """
    out: dict[str, Any] = {}
    problems = []
    for item in text.replace(",", " ").split():
        key, sep, value = item.partition("=")
        key = {"sequence_parallel": "sp"}.get(key, key)
        if not sep or key not in ("tp", "sp"):
            problems.append(Problem("--layout", f"{item!r}: expected tp=N or sp=true|false"))
        elif key == "tp" and (not value.isdigit() or int(value) < 1):
            problems.append(Problem("--layout", f"{item!r}: tp must be an integer >= 1"))
        elif key == "sp" and value.lower() not in ("true", "false", "1", "0"):
            problems.append(Problem("--layout", f"{item!r}: sp must be true or false"))
        else:
            out[key] = int(value) if key == "tp" else value.lower() in ("true", "1")
    if problems:
        raise ConfigError(problems)
    return out


def resolve_model(name: str) -> ModelSpec:
    """A preset name, a Hugging Face ``config.json`` (or its folder), or ``cpu-default``."""
    if name in ("cpu-default", CPU_DEFAULT_MODEL.name):
        return CPU_DEFAULT_MODEL
    path = Path(name)
    if path.exists():
        return from_hf_config(path)
    return preset(name)


def read_run(path: str) -> RunConfig:
    """A run config's schema-validated sections, without the hardware cross-checks (its hardware may be
    the profile being made)."""
    try:
        return RunConfig.model_validate(read_config_file(path))
    except ValidationError as exc:
        raise ConfigError([Problem(".".join(str(x) for x in e["loc"]), e["msg"]) for e in exc.errors()]) from None


def target_from_config(path: str) -> Target:
    """The target of a simtrain run config (its model, tp, sp, seq_len and micro-batch size)."""
    run = read_run(path)
    return Target(run.model, run.layout.tp, run.layout.sequence_parallel, run.train.seq_len,
                  run.train.micro_batch_size)


#: simtrain's fused GEMMs that the eager_hf stack runs as several Linears: the fused QKV projection
#: (HF: q_proj, k_proj, v_proj) and the SwiGLU up-projection (HF: gate_proj, up_proj). They are timed
#: as the stack runs them and recorded under simtrain's kernel name (``calibration.compute``).
COMPOSITE_GEMMS = ("qkv", "mlp_up")


@dataclass
class KernelCalls:
    """The kernels simtrain's lowering emits for one target.

    ``gemms`` holds (kernel, role, m, n, k): kernel is a name of ``COMPOSITE_GEMMS`` or "" (a plain
    GEMM, shared by every kernel of that shape).
    """

    gemms: set[tuple[str, str, int, int, int]] = field(default_factory=set)
    attention: set[tuple[int, int, int, int, int, int, bool, bool]] = field(default_factory=set)
    memory_bytes: dict[str, float] = field(default_factory=dict)  # operation kind -> bytes at the target


def _record(calls: KernelCalls, desc: KernelDesc) -> None:
    """Add one kernel descriptor of the lowered program to ``calls`` (a slice: its whole kernel)."""
    if isinstance(desc, Sliced):
        desc = desc.of
    if isinstance(desc, Gemm):
        if desc.batch == 1:
            base = desc.name.split(".")[0]
            calls.gemms.add((base if base in COMPOSITE_GEMMS else "", gemm_role(desc.name), desc.m, desc.n, desc.k))
    elif isinstance(desc, Attention):
        calls.attention.add(desc.key)
    elif isinstance(desc, MemoryBound):
        calls.memory_bytes.setdefault(memory_op_kind(desc.name), desc.bytes)


def placeholder_gpu() -> GpuSpec:
    """A stand-in GpuSpec for lowering when only kernel shapes and bytes matter (no profile files read)."""
    return GpuSpec(name="calibration", bf16_flops_per_s=1e12, fp8_flops_per_s=0.0, tf32_flops_per_s=1e12,
                   fp32_flops_per_s=1e12, hbm_bytes=1e9, hbm_Bps=1e11, sm_count=1, l2_bytes=0.0, nvlink_Bps=1e9,
                   gemm_efficiency=1.0, attention_fwd_efficiency=1.0, attention_bwd_efficiency=1.0,
                   hbm_efficiency=1.0, memory_op_efficiency=1.0, kernel_launch_s=0.0, nvlink_efficiency=1.0,
                   nvls_algbw_Bps=0.0, nvls_min_gpus=0, nic_efficiency=1.0, comm_interference_nvlink=0.0,
                   comm_interference_net=0.0, cuda_context_bytes=0.0, nccl_buffer_bytes=0.0)


def kernel_calls(target: Target) -> KernelCalls:
    """Lower ``target`` with simtrain and return the kernels of its program (shapes and byte counts), in
    program order (a memory-bound operation's bytes are those of its first kernel)."""
    calls = KernelCalls()
    for prog in lower_program(target.run()).programs:
        for op in prog.ops:
            if isinstance(op, ComputeOp):
                for desc in op.kernels:
                    _record(calls, desc)  # type: ignore[arg-type]  # a lowered program holds descriptors
    return calls


def gemm_grid(sizes: tuple[int, ...]) -> list[tuple[str, str, int, int, int]]:
    """Forward GEMMs over every (m, n, k) in ``sizes``^3 (the grid the fitted model interpolates over)."""
    return [("", "fwd", m, n, k) for m in sizes for n in sizes for k in sizes]


def composite_parts(kernel: str, model: ModelSpec, tp: int) -> list[int]:
    """Output widths of the Linears the eager_hf stack runs for a fused simtrain GEMM (per TP rank)."""
    if kernel == "qkv":
        kv = max(model.kv_dim // tp, model.d_head)
        return [model.q_dim // tp, kv, kv]
    if kernel == "mlp_up" and model.activation == "swiglu":
        return [model.ffn_hidden // tp] * 2
    return []


def attention_grid(calls: KernelCalls) -> list[tuple[int, int, int, int, int, int, bool, bool]]:
    """The target's attention shapes at 1/4 and 2x its sequence length (forward and backward)."""
    out = []
    for b, s_q, _s_kv, a, g, d, causal, bwd in sorted(calls.attention):
        for f in (0.25, 2.0):
            s = max(int(s_q * f) // 16 * 16, 16)
            out.append((b, s, s, a, g, d, causal, bwd))
    return sorted(set(out) - calls.attention)


def param_shapes(model: ModelSpec, tp: int, layers: int | None = None) -> list[tuple[int, ...]]:
    """Parameter tensors of one TP rank, laid out as Llama implementations keep them (q, k, v, o,
    gate, up, down, two norms per layer; embedding, final norm, LM head), for the optimizer benchmark."""
    h, q, kv, f = model.hidden, model.q_dim // tp, max(model.kv_dim // tp, model.d_head), model.ffn_hidden // tp
    per_layer: list[tuple[int, ...]] = [(q, h), (kv, h), (kv, h), (h, q)]
    per_layer += [(f, h), (f, h), (h, f)] if model.activation == "swiglu" else [(f, h), (h, f)]
    per_layer += [(h,), (h,)]
    head = [] if model.tied_embeddings else [(model.vocab // tp, h)]
    return [(model.vocab // tp, h), *per_layer * (model.n_layers if layers is None else layers), (h,), *head]


def memory_op_shapes(target: Target) -> dict[str, dict[str, Any]]:
    """The tensors each memory-bound benchmark uses at the target's shape (one rank)."""
    m, t = target.model, target.tp
    rows = target.tokens
    norm_rows = rows // t if target.sp else rows
    shapes: dict[str, dict[str, Any]] = {
        "norm": {"rows": norm_rows, "cols": m.hidden, "norm": m.norm},
        "residual": {"rows": norm_rows, "cols": m.hidden},
        "act": {"rows": rows, "cols": m.ffn_hidden // t, "activation": m.activation},
        "cross_entropy": {"rows": rows, "cols": m.vocab // t},
        "embedding": {"rows": rows, "cols": m.hidden, "vocab": m.vocab // t},
    }
    if m.position == "rope":
        shapes["rope"] = {"b": target.micro_batch_size, "s": target.seq_len, "heads": max(m.n_heads // t, 1),
                          "kv_heads": max(m.kv_heads // t, 1), "d": m.d_head}
    return shapes


def elements(kind: str, shape: dict[str, Any]) -> int:
    """Elements a memory-bound benchmark processes (the x its simtrain byte count scales with)."""
    base = kind.removesuffix(".bwd")
    if base == "rope":
        return shape["b"] * shape["s"] * (shape["heads"] + shape["kv_heads"]) * shape["d"]
    if base == "optimizer.step":
        return sum(math.prod(p) for p in shape["params"])
    return shape["rows"] * shape["cols"]


def scaled(kind: str, shape: dict[str, Any], factor: float) -> dict[str, Any]:
    """``shape`` with its token dimension scaled by ``factor`` (at least 16 rows / one sequence)."""
    out = dict(shape)
    if kind.startswith("rope"):
        out["s"] = max(int(shape["s"] * factor) // 16 * 16, 16)
    else:
        out["rows"] = max(int(shape["rows"] * factor) // 16 * 16, 16)
    return out
