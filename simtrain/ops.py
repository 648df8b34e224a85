"""The op IR between lowering and the engine: a per-rank DAG of typed ops (Chakra-like).

Each rank's program is a list of ops; an op runs on one stream of its GPU. Ops on one stream run in
list order (as CUDA kernels on one stream do); ``deps`` name ops of *other* streams of the same
program, and ``remote`` names an op of another stage's program (a pipeline send) that must finish
first. Memory is part of the IR: ``mem_start`` deltas are applied to the rank's ledger when the op
starts and ``mem_end`` when it ends (the DESIGN's Alloc/Free, folded into the op that causes them so
the event loop does no extra work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from simtrain.kernels import KernelDesc


class Stream(IntEnum):
    """Streams of one GPU: compute, and one per communication class."""

    COMPUTE = 0
    TP = 1
    DP = 2
    PP = 3
    CP = 4
    EP = 5
    DP_GATHER = 6
    """ZeRO-3/FSDP parameter all-gathers: FSDP2 issues them on their own stream and process group, so
    they neither wait behind nor block the gradient reduce-scatters of the DP stream (PyTorch
    ``torch.distributed.fsdp.fully_shard``: ``all_gather_stream`` / ``reduce_scatter_stream``)."""
    OFFLOAD = 7
    """Device-to-host copies of offloaded activations (``simtrain.offload``)."""
    RELOAD = 8
    """Host-to-device copies bringing them back before backward."""


class OpKind(IntEnum):
    """What an op does."""

    COMPUTE = 0
    COLLECTIVE = 1
    SEND = 2
    COPY = 3
    """A copy between GPU and host memory on a copy stream, ``duration_s`` long (PCIe / NVLink-C2C)."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """A costed kernel (what a cost source makes of a ``simtrain.kernels`` descriptor): hardware FLOPs,
    the HBM bytes it moves on this GPU and stack, and its modelled time, seconds."""

    name: str
    flops: float
    bytes: float
    time_s: float
    shape: tuple[int, int, int, int] | None = None
    """(m, n, k, batch) of a GEMM, for costing it again in row chunks (TP comm overlap); None otherwise."""


@dataclass(slots=True)
class Op:
    """One node of a rank's DAG.

    Attributes:
        idx: position in the program (ids are local to each program).
        kind: compute, collective, pipeline send or host copy.
        stream: the GPU stream it occupies.
        name: label for traces.
        category: breakdown class: "fwd", "bwd", "recompute", "optimizer", "comm".
        deps: indices of ops (other streams, same program) that must finish first.
        remote: (stage, op index) of another stage's op that must finish first (a pipeline recv).
        duration_s: modelled time of a compute op (sum of its kernels) or a host copy, seconds; set by
            the cost pass (``simtrain.cost_pass``), 0 in a lowered program.
        kernels: the kernels of a compute op (time order): descriptors (``simtrain.kernels``) in a
            lowered program, costed ``Kernel`` in a costed one.
        coll: collective kind ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") or "send".
        axis: mesh axis of a collective ("tp", "dp", "dp_shard", "dp_replicate", "pp", ...).
        comm_bytes: nccl-tests "size" S of the collective, or the bytes of a send, in bytes.
        peer_stage: destination stage of a send.
        mem_start / mem_end: (tag, bytes) ledger deltas at start / end (negative frees).
    """

    idx: int
    kind: OpKind
    stream: Stream
    name: str
    category: str = "fwd"
    deps: tuple[int, ...] = ()
    remote: tuple[int, int] | None = None
    duration_s: float = 0.0
    kernels: tuple[KernelDesc, ...] | tuple[Kernel, ...] = ()
    coll: str = ""
    axis: str = ""
    comm_bytes: float = 0.0
    peer_stage: int = -1
    microbatch: int = -1
    chunk: int = 0
    mem_start: tuple[tuple[str, float], ...] = ()
    mem_end: tuple[tuple[str, float], ...] = ()
    expert_s: float = 0.0
    """Part of ``duration_s`` spent in routed-expert kernels, which the engine scales by the rank's
    routed load (simtrain.routing)."""

    @property
    def flops(self) -> float:
        """Hardware FLOPs of a compute op."""
        return sum(k.flops for k in self.kernels)


@dataclass(slots=True)
class Program:
    """The op DAG of one pipeline stage's ranks (identical for all ranks of a stage in dense models).

    Attributes:
        stage: pipeline stage index.
        ops: all ops, in issue order.
        static_mem: (tag, bytes) allocated for the whole step (weights, grads, optimizer, ...).
    """

    stage: int
    ops: list[Op] = field(default_factory=list)
    static_mem: dict[str, float] = field(default_factory=dict)

    def add(self, kind: OpKind, stream: Stream, name: str, **kw: object) -> Op:
        """Append an op and return it (its ``idx`` is its position)."""
        op = Op(len(self.ops), kind, stream, name, **kw)  # type: ignore[arg-type]
        self.ops.append(op)
        return op

    def stream_ops(self, stream: Stream) -> list[Op]:
        """Ops of one stream, in issue order."""
        return [o for o in self.ops if o.stream == stream]
