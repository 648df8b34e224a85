"""The op IR between lowering and the engine: a per-rank DAG of typed ops (Chakra-like).

Each rank's program is a list of ops; an op runs on one stream of its GPU. Ops on one stream run in
list order (as CUDA kernels on one stream do); ``deps`` name ops of *other* streams of the same
program, and ``remote`` names an op of another stage's program (a pipeline send) that must finish
first. Memory is part of the IR: ``mem_start`` deltas are applied to the rank's ledger when the op
starts and ``mem_end`` when it ends (the DESIGN's Alloc/Free, folded into the op that causes them so
the event loop does no extra work).

An op is one of a small tagged union (``Op.kind`` names the class): ``ComputeOp`` (kernels),
``CollectiveOp`` and ``SendOp`` (``CommOp``: what the network model times), ``CopyOp`` (a GPU <-> host
copy). Lowering emits them without times (kernel descriptors, ``simtrain.lower.kernels``); the cost pass
(``simtrain.cost.cost_pass``) makes the costed program, whose compute ops and copies are
``CostedComputeOp`` / ``CostedCopyOp`` with their ``duration_s``; the engine runs only a costed program.
A memory-only step (the offload waits) is a compute op without kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

from simtrain.lower.kernels import KernelDesc
from simtrain.spec.collective_kinds import Collective


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
    """Device-to-host copies of offloaded activations (``simtrain.lower.offload``)."""
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
    """A costed kernel (what a cost source makes of a ``simtrain.lower.kernels`` descriptor): hardware FLOPs,
    the HBM bytes it moves on this GPU and stack, and its modelled time, seconds."""

    name: str
    flops: float
    bytes: float
    time_s: float
    shape: tuple[int, int, int, int] | None = None
    """(m, n, k, batch) of a GEMM, for costing it again in row chunks (TP comm overlap); None otherwise."""
    launches: int = 1
    """GPU kernels it stands for (an unfused op is several), each issued by the CPU (``simtrain.cost.host``)."""


@dataclass(slots=True)
class Op:
    """One node of a rank's DAG: what every kind of op has (the kinds are the subclasses below).

    Attributes:
        idx: position in the program (ids are local to each program).
        kind: compute, collective, pipeline send or host copy (a class constant of each kind).
        stream: the GPU stream it occupies.
        name: label for traces.
        category: breakdown class: "fwd", "bwd", "recompute", "optimizer", "comm".
        deps: indices of ops (other streams, same program) that must finish first.
        remote: (stage, op index) of another stage's op that must finish first (a pipeline recv).
        microbatch / chunk: the micro-batch (-1: none) and model chunk it belongs to.
        mem_start / mem_end: (tag, bytes) ledger deltas at start / end (negative frees).
    """

    kind: ClassVar[OpKind]
    idx: int
    stream: Stream
    name: str
    category: str = "fwd"
    deps: tuple[int, ...] = ()
    remote: tuple[int, int] | None = None
    microbatch: int = -1
    chunk: int = 0
    mem_start: tuple[tuple[str, float], ...] = ()
    mem_end: tuple[tuple[str, float], ...] = ()


@dataclass(slots=True)
class ComputeOp(Op):
    """Kernels on the compute stream, as lowering emits them: descriptors (``simtrain.lower.kernels``), no time.
    A compute op without kernels only waits for its deps and applies its memory deltas."""

    kind: ClassVar[OpKind] = OpKind.COMPUTE
    kernels: tuple[KernelDesc, ...] | tuple[Kernel, ...] = ()
    """The kernels, in time order."""
    sync_before: bool = False
    """The CPU waits for the GPU to drain before issuing these kernels: a synchronous pipeline receive
    (``SoftwareStack.synchronous_p2p``) feeds them, so the CPU gains no run-ahead while the GPU waits for it."""

    @property
    def flops(self) -> float:
        """Hardware FLOPs of its kernels."""
        return sum(k.flops for k in self.kernels)


@dataclass(slots=True)
class CostedComputeOp(ComputeOp):
    """A compute op with its time (``simtrain.cost.cost_pass``): costed kernels, ``duration_s`` their sum."""

    kernels: tuple[Kernel, ...] = ()
    duration_s: float = 0.0
    """Modelled time, seconds (the sum of its kernels' times)."""
    expert_s: float = 0.0
    """Part of ``duration_s`` spent in routed-expert kernels, which the engine scales by the rank's
    routed load (simtrain.plan.routing)."""
    host_stall_s: float = 0.0
    """Part of ``duration_s`` the GPU idles before the kernels, waiting for the CPU to issue them
    (``simtrain.cost.host``): no compute, so the engine neither slows it by the collectives in flight nor
    scales it by the GPU's speed."""
    host_sync: bool = False
    """The CPU waits for the GPU to drain during this op (a host synchronisation, ``simtrain.cost.host``):
    its run-ahead is lost here."""
    host_hideable_s: float = 0.0
    """Part of ``host_stall_s`` a wait before the op hides, the CPU issuing meanwhile
    (``simtrain.cost.host.RunAhead``): the stall before the op's first host sync, or, for an op that starts with
    one (``sync_before``, the gradient norm's), the issue the CPU still owed before it."""


@dataclass(slots=True)
class CommOp(Op):
    """A communication op: a collective of a mesh axis's group, or a pipeline send. The network model
    (``simtrain.cost.collectives``, ``simtrain.engine.network``) times it while the engine runs."""

    coll: Collective | None = None
    """What it runs: its kind and typed options (``simtrain.spec.collective_kinds.Collective``)."""
    axis: str = ""
    """Mesh axis of the group ("tp", "dp", "dp_shard", "dp_replicate", "pp", ...)."""
    comm_bytes: float = 0.0
    """nccl-tests "size" S of the collective, or the bytes of a send, in bytes."""
    host_issued: bool = True
    """A ``torch.distributed`` call the CPU issues between the compute kernels (its CPU time:
    ``simtrain.cost.host``); False for the chunks of a collective that TP comm overlap fuses with its GEMM
    (Transformer Engine userbuffers, torch async TP), launched as part of the chunked GEMMs."""
    sync_after: bool = False
    """The CPU waits for the GPU to drain after issuing it (a synchronous pipeline exchange,
    ``SoftwareStack.synchronous_p2p``: Megatron's ``torch.cuda.synchronize()`` after ``batch_isend_irecv``)."""


@dataclass(slots=True)
class CollectiveOp(CommOp):
    """A collective (``coll``: "all_reduce", "all_gather", "reduce_scatter", "all_to_all", ...)."""

    kind: ClassVar[OpKind] = OpKind.COLLECTIVE


@dataclass(slots=True)
class SendOp(CommOp):
    """A pipeline send (``coll`` "send") to ``peer_stage``; the receiving op names it in ``remote``."""

    kind: ClassVar[OpKind] = OpKind.SEND
    peer_stage: int = -1
    """Destination stage."""


@dataclass(slots=True)
class CopyOp(Op):
    """A copy of ``comm_bytes`` between GPU and host memory on a copy stream (PCIe / NVLink-C2C), as
    lowering emits it: no time."""

    kind: ClassVar[OpKind] = OpKind.COPY
    axis: str = "offload"
    """Breakdown axis of its time."""
    comm_bytes: float = 0.0
    """Bytes copied."""


@dataclass(slots=True)
class CostedCopyOp(CopyOp):
    """A host copy with its time (``simtrain.cost.cost_pass``: the host link's copy time)."""

    duration_s: float = 0.0
    """Modelled time, seconds."""


_OP_CLASS: dict[OpKind, type[Op]] = {OpKind.COMPUTE: ComputeOp, OpKind.COLLECTIVE: CollectiveOp,
                                     OpKind.SEND: SendOp, OpKind.COPY: CopyOp}
_COSTED_CLASS: dict[OpKind, type[Op]] = {OpKind.COMPUTE: CostedComputeOp, OpKind.COPY: CostedCopyOp}


def op_class(kind: OpKind, costed: bool = False) -> type[Op]:
    """The op class of ``kind`` (``costed``: the class that carries a time, for compute ops and copies)."""
    return _COSTED_CLASS[kind] if costed and kind in _COSTED_CLASS else _OP_CLASS[kind]


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
        """Append an op of ``kind`` and return it (its ``idx`` is its position); ``kw`` are fields of that
        kind's class (a compute op or copy given ``duration_s`` is a costed one)."""
        cls = _OP_CLASS[kind] if "duration_s" not in kw else op_class(kind, costed=True)
        op = cls(len(self.ops), stream, name, **kw)  # type: ignore[arg-type]
        self.ops.append(op)
        return op

    def stream_ops(self, stream: Stream) -> list[Op]:
        """Ops of one stream, in issue order."""
        return [o for o in self.ops if o.stream == stream]
