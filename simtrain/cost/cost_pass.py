"""The cost pass: a lowered (hardware-neutral) program -> the same program with times.

Lowering (``simtrain.lower.lowering.lower_program``) emits compute ops whose kernels are descriptors
(``simtrain.lower.kernels``: shapes, FLOPs, bytes, no time) and host copies that carry only their bytes. A
:class:`CostSource` turns a descriptor into a costed ``Kernel`` and a byte count into a host-copy time;
``cost_program`` applies one to every op: a compute op's ``duration_s`` is the sum of its kernels'
times in kernel order plus the GPU idle time the host causes (``simtrain.cost.host``), ``expert_s`` the part in routed-expert kernels (``expert.*``, which the engine
scales by a rank's routed load), a copy's ``duration_s`` the host link's time. Collectives and sends
are timed by the engine's network model, not here.

The built-in GPU roofline (``simtrain.cost.costs.ComputeCostModel``) is a cost source; a calibrated profile
is the same class holding the measured tables (``calibration``), which replace the roofline for every
kernel they cover, so a measured kernel table and a roofline estimate are interchangeable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from simtrain.cost.costs import ComputeCostModel
from simtrain.cost.host import add_host_gaps, host_model_of
from simtrain.lower.blocks import Comm, Ring
from simtrain.lower.kernels import KernelDesc
from simtrain.lower.lowering import Lowered, lower_program
from simtrain.lower.ops import ComputeOp, CopyOp, CostedComputeOp, CostedCopyOp, Kernel, Op, Program
from simtrain.spec.config import RunConfig

CostedSegment = tuple[Kernel, ...] | Comm | Ring[Kernel]
"""A segment (``simtrain.lower.blocks.Segment``) whose kernels carry times."""


class CostSource(Protocol):
    """Where kernel times come from (``ComputeCostModel``: roofline, or a calibrated profile's tables)."""

    def kernel(self, desc: KernelDesc) -> Kernel:
        """The costed kernel of ``desc`` (time, and the FLOPs and bytes it runs with)."""
        ...

    def kernel_time(self, desc: KernelDesc) -> float:
        """Seconds of one kernel."""
        ...

    def host_copy_s(self, nbytes: float) -> float:
        """Seconds of one copy of ``nbytes`` between GPU and host memory."""
        ...


class _Memo:
    """Costed kernels by descriptor, and costed kernel tuples by the identity of their descriptor tuple
    (a layer's segments are emitted once per micro-batch: the same tuple object many times)."""

    def __init__(self, source: CostSource):
        self.source = source
        self.kernels: dict[KernelDesc, Kernel] = {}
        self.tuples: dict[int, tuple[tuple[KernelDesc, ...], tuple[Kernel, ...], float, float]] = {}

    def kernel(self, desc: KernelDesc) -> Kernel:
        hit = self.kernels.get(desc)
        if hit is None:
            if isinstance(desc, Kernel):
                raise ValueError(f"kernel {desc.name!r} is already costed")
            hit = self.kernels[desc] = self.source.kernel(desc)
        return hit

    def add(self, descs: tuple[KernelDesc, ...]) -> tuple[tuple[KernelDesc, ...], tuple[Kernel, ...], float, float]:
        """(descriptors, costed kernels, their time s, their routed-expert time s), memoised."""
        kernels = tuple(self.kernel(d) for d in descs)
        hit = self.tuples[id(descs)] = (descs, kernels, sum((k.time_s for k in kernels), 0.0),
                                        sum((k.time_s for k in kernels if k.name.startswith("expert.")), 0.0))
        return hit


def cost_program(program: Program, source: CostSource, memo: _Memo | None = None, host_gaps: bool = True) -> Program:
    """A costed copy of ``program``: every compute op's kernels costed by ``source`` and its duration set,
    every host copy timed (``CostedComputeOp``, ``CostedCopyOp``); other ops are shared with ``program``
    (they carry no time). ``program`` is left as it is, so it can be costed again with another source.
    ``memo``: costed kernels of ``source`` to reuse (``lower`` shares one across a run's stages, whose
    programs emit the same kernel tuples); None: a new one. ``host_gaps`` False: without the host's GPU idle
    time (the caller adds it, ``simtrain.cost.host``)."""
    if memo is None or memo.source is not source:
        memo = _Memo(source)
    tuples = memo.tuples
    ops: list[Op] = []
    for op in program.ops:
        kind = type(op)  # exact classes: the costed ones are subclasses (hot loop: no isinstance chain)
        if kind is ComputeOp:
            descs: tuple[KernelDesc, ...] = op.kernels  # type: ignore[attr-defined]
            hit = tuples.get(id(descs))
            if hit is None or hit[0] is not descs:
                hit = memo.add(descs)
            op = CostedComputeOp(op.idx, op.stream, op.name, op.category, op.deps, op.remote, op.microbatch, op.chunk,
                                 op.mem_start, op.mem_end, kernels=hit[1],
                                 sync_before=op.sync_before,  # type: ignore[attr-defined]
                                 duration_s=hit[2], expert_s=hit[3])
        elif kind is CopyOp:
            assert isinstance(op, CopyOp)
            op = CostedCopyOp(op.idx, op.stream, op.name, op.category, op.deps, op.remote, op.microbatch, op.chunk,
                              op.mem_start, op.mem_end, op.axis, op.comm_bytes, source.host_copy_s(op.comm_bytes))
        elif kind is CostedComputeOp or kind is CostedCopyOp:
            raise ValueError(f"op {op.idx} ({op.name}) of this program is already costed")
        ops.append(op)
    if host_gaps:
        ops = add_host_gaps(ops, host_model_of(source))
    return Program(program.stage, ops, dict(program.static_mem))


def cost_kernels(kernels: Sequence[KernelDesc], source: CostSource) -> tuple[Kernel, ...]:
    """The costed kernels of ``kernels``, in order."""
    return tuple(source.kernel(k) for k in kernels)


def cost_segments(segs: Sequence[object], source: CostSource) -> list[CostedSegment]:
    """Segments (``simtrain.lower.blocks.Segment``) with their kernels costed; collectives unchanged."""
    out: list[CostedSegment] = []
    for s in segs:
        if isinstance(s, Comm):
            out.append(s)
        elif isinstance(s, Ring):
            out.append(Ring(s.steps, cost_kernels(s.kernels, source), s.comm))
        elif isinstance(s, tuple):
            out.append(cost_kernels(s, source))
        else:
            raise TypeError(f"not a segment: {s!r}")
    return out


def lower(run: RunConfig, cost: ComputeCostModel, host_Bps: float = 0.0) -> Lowered:
    """``lowering.lower_program``, then every program costed by ``cost`` (``cost_program``).

    ``host_Bps``: GPU <-> host copy rate per direction (bytes/s), needed when the layout offloads
    activations (``NodeSpec.host_link_Bps``); it replaces ``cost.host_Bps`` when given."""
    if run.layout.offload_activation_layers and max(host_Bps, cost.host_Bps) <= 0:
        raise ValueError("offloading activations needs the GPU <-> host copy rate host_Bps > 0")
    source = replace(cost, host_Bps=host_Bps) if host_Bps > 0 else cost
    lowered = lower_program(run)
    memo = _Memo(source)
    return replace(lowered, programs=[cost_program(p, source, memo) for p in lowered.programs])
