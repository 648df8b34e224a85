"""Calibrated cost functions: what a measured profile (``simtrain/hardware/profile.py``) puts in place of the defaults.

Three kinds of function, all pure Python and deterministic:

- :class:`Curve`, a 1-D time curve ``t(x)`` (x = bytes, FLOPs or a message size). **Interpolation**:
  piecewise linear in log-log space between the measured medians (a power law between neighbours,
  the usual view of latency/bandwidth curves, as in nccl-tests' log-size sweeps). **Extrapolation**:
  beyond the last (or before the first) measured point the fitted affine model ``t = a_s + x / rate``
  (latency plus throughput, the alpha-beta model of the reference's Table B) carries the curve,
  scaled so that it is continuous at that end point: ``t(x) = t_end * fit(x) / fit(x_end)``.
- :class:`GemmModel`, the time of a GEMM (m, n, k) for one role (forward, input-grad, weight-grad).
  A shape that was measured returns its measured median (for simtrain's fused ``qkv`` and
  ``mlp_up`` kernels, the time of the Linears the calibrated software stack runs instead, when it was
  measured under that kernel's name). Any other shape gets the fitted model
  ``t = t0_s + 2mnk / (peak_role * u(m) u(n) u(k))`` with ``u(x) = x / (x + x_half)`` (a saturating
  utilisation per dimension: small dimensions cannot fill the tiles or the vector units; cf. the tile
  and wave quantisation of NVIDIA's *Matrix Multiplication Background User's Guide*), times the
  measured/fitted ratio of the nearest measured shapes, interpolated by inverse-distance weighting
  over (log m, log n, log k). Outside the measured box (any dimension more than 2x beyond it) the
  correction is dropped and the fitted model extrapolates alone.
- :class:`CollectiveTable`, one :class:`Curve` per (collective, ranks, nodes) over the nccl-tests
  size S; it gives a latency (the time of the smallest measured message) and the total time.

Memory-bound kernels are looked up by *kind* (``memory_op_kind``): simtrain's kernel names (``ln1``,
``residual2.bwd`` ...) map to the operation the calibration timed (``norm``, ``residual.bwd``). The x
of a memory-op curve is the byte count simtrain's own kernel carries (``Kernel.bytes``), so a lookup
needs no unit conversion whatever dtype the device was measured in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from simtrain.spec.collective_kinds import CollectiveKind

GEMM_ROLES = ("fwd", "dgrad", "wgrad")
IDW_NEIGHBOURS = 4  # measured shapes that shape the local correction of the GEMM fit
IDW_POWER = 2.0  # inverse-distance weight exponent (Shepard's method)
BOX_SLACK = 2.0  # the GEMM correction applies up to 2x beyond the measured range of each dimension

# simtrain kernel name (lower/blocks/, lowering.py) -> the operation the calibration measures
_MEMORY_OP_KIND = {
    "ln1": "norm", "ln2": "norm", "final_norm": "norm",
    "residual1": "residual", "residual2": "residual",
    "rope": "rope", "act": "act",
    "cross_entropy": "cross_entropy",
    "embedding": "embedding", "pos_embedding": "copy",
    "attn.softmax": "softmax",
    "optimizer.step": "optimizer.step",
}


#: Kernels outside the decoder layers (simtrain.lower names): the embedding, the final norm, the LM head,
#: the loss and the optimizer. The in-situ factor is measured on a layer and applies to layer kernels only.
OUTSIDE_LAYER = ("embedding", "pos_embedding", "final_norm", "lm_head", "cross_entropy", "optimizer")


def in_layer(name: str) -> bool:
    """Whether simtrain kernel ``name`` belongs to a decoder layer (not ``OUTSIDE_LAYER``)."""
    return not name.startswith(OUTSIDE_LAYER)


def memory_op_kind(name: str) -> str:
    """The calibrated operation a simtrain memory-bound kernel is (``ln2.bwd`` -> ``norm.bwd``).

    Unknown names map to ``copy`` (plain memory bandwidth).
    """
    base, dot, suffix = name.partition(".bwd")
    kind = _MEMORY_OP_KIND.get(base if dot else name, "copy")
    return f"{kind}.bwd" if dot and kind not in ("copy", "optimizer.step") else kind


def gemm_role(name: str) -> str:
    """The GEMM role of a simtrain kernel name: ``*.dgrad`` input-grad, ``*.wgrad`` weight-grad, else forward."""
    if name.endswith(".dgrad"):
        return "dgrad"
    if name.endswith(".wgrad"):
        return "wgrad"
    return "fwd"


@dataclass(frozen=True, slots=True)
class Curve:
    """A measured time curve t(x), seconds, with its affine fit ``t = a_s + x / rate``.

    Attributes:
        x: measured abscissae, strictly increasing, > 0 (bytes, FLOPs or message bytes).
        t_s: measured median times at ``x``, seconds, > 0.
        a_s: fitted fixed cost (latency, launch), seconds, >= 0.
        rate: fitted throughput, units of x per second, > 0.
    """

    x: tuple[float, ...]
    t_s: tuple[float, ...]
    a_s: float
    rate: float

    def fit(self, x: float) -> float:
        """The affine model at ``x``, seconds."""
        return self.a_s + x / self.rate

    def __call__(self, x: float) -> float:
        """Time at ``x``: log-log interpolation inside the measured range, the scaled fit outside."""
        xs, ts = self.x, self.t_s
        if x <= 0:
            return self.a_s if self.a_s > 0 else ts[0]
        if x <= xs[0]:
            return ts[0] * self.fit(x) / self.fit(xs[0])
        if x >= xs[-1]:
            return ts[-1] * self.fit(x) / self.fit(xs[-1])
        lo, hi = 0, len(xs) - 1
        while hi - lo > 1:  # bisection: the largest measured x below the query
            mid = (lo + hi) // 2
            if xs[mid] <= x:
                lo = mid
            else:
                hi = mid
        w = (math.log(x) - math.log(xs[lo])) / (math.log(xs[hi]) - math.log(xs[lo]))
        return math.exp((1 - w) * math.log(ts[lo]) + w * math.log(ts[hi]))


@dataclass(frozen=True, slots=True, eq=False)
class GemmModel:
    """Measured GEMM times plus the fitted model for shapes that were not measured.

    Attributes:
        t0_s: fixed cost per call, seconds.
        peak_flops_per_s: fitted asymptotic FLOP/s per role ("fwd", "dgrad", "wgrad").
        m_half, n_half, k_half: the dimension at which utilisation is one half, elements.
        points: measured (kernel, role, m, n, k) -> median time, seconds; kernel is "" for a plain
            GEMM, or a fused simtrain kernel ("qkv", "mlp_up") timed as the stack runs it.
    """

    t0_s: float
    peak_flops_per_s: Mapping[str, float]
    m_half: float
    n_half: float
    k_half: float
    points: Mapping[tuple[str, str, int, int, int], float] = field(default_factory=dict)

    def fitted_s(self, role: str, m: int, n: int, k: int) -> float:
        """The fitted model's time for one GEMM, seconds (no measured correction)."""
        peak = self.peak_flops_per_s.get(role) or self.peak_flops_per_s["fwd"]
        util = (m / (m + self.m_half)) * (n / (n + self.n_half)) * (k / (k + self.k_half))
        return self.t0_s + 2.0 * m * n * k / (peak * util)

    def time_s(self, role: str, m: int, n: int, k: int, kernel: str = "") -> float:
        """Time of one (m x k) @ (k x n) GEMM in ``role`` (of simtrain kernel ``kernel``): measured if it
        was (under that kernel's name first, then as a plain GEMM), else fit x local correction."""
        hit = self.points.get((kernel, role, m, n, k)) if kernel else None
        if hit is None:
            hit = self.points.get(("", role, m, n, k))
        if hit is not None:
            return hit
        return self.fitted_s(role, m, n, k) * self._correction(role, m, n, k)

    def _correction(self, role: str, m: int, n: int, k: int) -> float:
        plain = [((key[1], key[2], key[3], key[4]), t) for key, t in self.points.items() if not key[0]]
        same = [(key, t) for key, t in plain if key[0] == role] or plain
        if not same:
            return 1.0
        q = (math.log(m), math.log(n), math.log(k))
        pts = [((math.log(key[1]), math.log(key[2]), math.log(key[3])), key, t) for key, t in same]
        for axis in range(3):
            lo = min(p[axis] for p, _, _ in pts) - math.log(BOX_SLACK)
            hi = max(p[axis] for p, _, _ in pts) + math.log(BOX_SLACK)
            if not lo <= q[axis] <= hi:
                return 1.0
        near = sorted(((math.dist(q, p), key, t) for p, key, t in pts), key=lambda x: x[0])[:IDW_NEIGHBOURS]
        num = den = 0.0
        for d, key, t in near:
            w = 1.0 / max(d, 1e-9) ** IDW_POWER
            num += w * math.log(t / self.fitted_s(*key))
            den += w
        return math.exp(num / den)


@dataclass(frozen=True, slots=True, eq=False)
class AttentionModel:
    """Measured attention kernels (exact shapes) and a curve over FlashAttention-convention FLOPs.

    ``points`` maps (b, s_q, s_kv, heads, kv_heads, d, causal, backward) to the median time, seconds;
    ``fwd`` and ``bwd`` are curves of time over the kernel's FLOPs (simtrain's ``flash_attention``).
    """

    fwd: Curve | None
    bwd: Curve | None
    points: Mapping[tuple[int, int, int, int, int, int, bool, bool], float] = field(default_factory=dict)

    def time_s(self, key: tuple[int, int, int, int, int, int, bool, bool], flops: float) -> float | None:
        """The measured time of this shape, else the curve at ``flops``; None when nothing was measured."""
        hit = self.points.get(key)
        if hit is not None:
            return hit
        curve = self.bwd if key[-1] else self.fwd
        return curve(flops) if curve is not None else None


@dataclass(frozen=True, slots=True, eq=False)
class CalibratedCompute:
    """The compute part of a calibrated profile, as ``ComputeCostModel`` consults it.

    Attributes:
        gemm: measured and fitted GEMMs (None: not calibrated).
        attention: measured attention kernels (None: not calibrated).
        memory_ops: time curves over simtrain kernel bytes, by operation kind (``memory_op_kind``).
        contention: slowdown factor by op class ("gemm", "attention", "memory") when the run has
            several processes on one CPU (1.0 on GPUs, where each process has its own device).
        in_situ: a whole layer step measured in one go over the sum of its kernels measured alone
            (launch and dispatch gaps, allocations, the small ops between kernels: what isolated
            timings miss, reference Notes 3 "Isolation vs in situ"); multiplies the kernels of the
            decoder layers (``in_layer``), where it was measured. Not the embedding, LM head, loss
            or optimizer: each is a few large kernels with no small ops between them, so a layer's
            per-kernel overheads scaled onto them would be counted where they do not occur; on a CPU
            the calibration times them inside training steps instead (``calibration.instep``: their
            outputs land on fresh pages there, issue 29 part 5) and the profile holds those times.
    """

    gemm: GemmModel | None
    attention: AttentionModel | None
    memory_ops: Mapping[str, Curve]
    contention: Mapping[str, float] = field(default_factory=dict)
    in_situ: float = 1.0

    def with_contention(self, factors: Mapping[str, float]) -> CalibratedCompute:
        """The same tables with per-class contention factors (see ``profile.CalibratedProfile``)."""
        return CalibratedCompute(self.gemm, self.attention, self.memory_ops, dict(factors), self.in_situ)

    def _scaled(self, op_class: str, t: float | None, in_situ: bool = True) -> float | None:
        if t is None:
            return None
        return t * self.contention.get(op_class, 1.0) * (self.in_situ if in_situ else 1.0)

    def gemm_s(self, name: str, m: int, n: int, k: int, batch: int = 1) -> float | None:
        """Seconds for ``batch`` GEMMs of kernel ``name``; None when GEMMs were not calibrated."""
        if self.gemm is None:
            return None
        return self._scaled("gemm", batch * self.gemm.time_s(gemm_role(name), m, n, k, name.split(".")[0]),
                            in_situ=in_layer(name))

    def attention_s(self, key: tuple[int, int, int, int, int, int, bool, bool], flops: float) -> float | None:
        """Seconds for an attention kernel (see ``AttentionModel.time_s``); None when not calibrated."""
        if self.attention is None:
            return None
        return self._scaled("attention", self.attention.time_s(key, flops))

    def memory_op_s(self, name: str, nbytes: float) -> float | None:
        """Seconds for memory-bound kernel ``name`` moving ``nbytes`` (simtrain's count); None if unknown."""
        kind = memory_op_kind(name)
        curve = self.memory_ops.get(kind) or self.memory_ops.get("copy")
        return self._scaled("memory", curve(nbytes), in_situ=in_layer(name)) if curve is not None else None


@dataclass(frozen=True, slots=True, eq=False)
class CollectiveTable:
    """Measured collective curves keyed by (collective, ranks, nodes) over the nccl-tests size S.

    Collectives: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send (point to point);
    a profile names them by their string value, which ``simtrain.hardware.profile`` parses into the enum.
    """

    curves: Mapping[tuple[CollectiveKind, int, int], Curve]

    def timing(self, kind: CollectiveKind, ranks: int, nodes: int, size_bytes: float) -> tuple[float, float] | None:
        """(latency_s, total_s) of one collective from the measured curve; None if that group was not measured.

        The latency is the measured time of the smallest message (capped by the total): it is what the
        flows cannot overlap; the rest is the wire time.
        """
        curve = self.curves.get((kind, ranks, nodes))
        if curve is None:
            return None
        total = curve(size_bytes)
        return min(curve.t_s[0], total), total

    @property
    def peak_busbw_Bps(self) -> float:
        """The highest bus bandwidth measured over all curves, bytes/s (0.0 when empty)."""
        best = 0.0
        for (kind, p, _), c in self.curves.items():
            for x, t in zip(c.x, c.t_s, strict=True):
                best = max(best, x * busbw_factor(kind, p) / t)
        return best


def busbw_factor(kind: CollectiveKind, ranks: int) -> float:
    """nccl-tests bus-bandwidth factor (``doc/PERFORMANCE.md``; reference Table B): busbw = algbw x factor."""
    p = ranks
    if kind == CollectiveKind.ALL_REDUCE:
        return 2.0 * (p - 1) / p
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL):
        return (p - 1) / p
    return 1.0


def curve_from_lists(x: Sequence[float], t_s: Sequence[float], a_s: float, rate: float) -> Curve:
    """Build a Curve (no checks; ``profile.py`` validates the file first)."""
    return Curve(tuple(float(v) for v in x), tuple(float(v) for v in t_s), float(a_s), float(rate))
