"""Emitting segments into a stage's program: compute ops on the compute stream, collectives on their axis's
stream, TP-overlapped GEMM/collective pairs in row chunks (simtrain.lower.lowering walks the schedule and
calls these)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from simtrain.lower.blocks import (
    TP_OVERLAP_CHUNKS,
    BlockBuilder,
    Comm,
    Ring,
    Segment,
    leading_gemms,
)
from simtrain.lower.kernels import KernelDesc, sliced
from simtrain.lower.ops import Op, OpKind, Program, Stream
from simtrain.lower.stack_rules import (
    tp_overlap_on,
)
from simtrain.spec.collective_kinds import CollectiveKind
from simtrain.spec.config import LayoutConfig

#: The stream each collective axis's ops run on.
STREAM_OF_AXIS = {"tp": Stream.TP, "cp": Stream.CP, "ep": Stream.EP, "etp": Stream.TP}

T = TypeVar("T")


def _by_identity(table: dict[Hashable, tuple[object, Any]], obj: object, key: Hashable, make: Callable[[], T]) -> T:
    """``make()``, memoised in ``table`` under ``key`` (built from ``id(obj)``); each entry holds ``obj``, so
    the id stays its own while the entry lives."""
    hit = table.get(key)
    if hit is None or hit[0] is not obj:
        hit = table[key] = (obj, make())
    return cast(T, hit[1])


class _Emitter:
    """Appends ops to one program, tracking the data dependency between streams."""

    def __init__(self, prog: Program, tp_overlap: bool, sync_recv: bool = False):
        self.prog = prog
        self.tp_overlap = tp_overlap
        self.sync_recv = sync_recv
        """The CPU waits for the GPU before the compute a pipeline receive feeds (``ComputeOp.sync_before``)."""
        self.last_compute: int | None = None
        self.pending_comm: Op | None = None
        self.pending_comm_spec: Comm | None = None
        """A TP collective whose chunks the next compute segment pipelines with (TP comm overlap)."""
        self.recv_key: tuple[str, int, int] | None = None
        self.recv_ops: dict[int, tuple[str, int, int]] = {}
        self.extra_deps: list[int] = []
        self.overlap_comm: Op | None = None
        self.overlap_skip = 0
        self.overlap_older: list[int] = []
        """Earlier overlapped collectives the compute segment after the next must also wait for."""
        self.trailing: list[Op] = []
        # Memos keyed by the identity of a block's segment objects (emitted once per micro-batch and layer:
        # the same objects many times; ``_by_identity``). They make the emitted kernel tuples the same
        # objects each time too, so the cost pass (memoised by tuple identity, ``cost_pass._Memo``) costs
        # each once. Pure: equal values, only fewer copies.
        self._names: dict[Hashable, tuple[object, Any]] = {}
        self._comm_names: dict[Hashable, tuple[object, Any]] = {}
        self._splits: dict[Hashable, tuple[object, Any]] = {}
        self._parts: dict[Hashable, tuple[object, Any]] = {}

    def comm(self, c: Comm, category: str, mb: int, chunk: int) -> None:
        """A collective after the last compute op; the next compute op waits for it."""
        if c.fused_with_gemm(self.tp_overlap):
            self.pending_comm_spec = c
            return
        self._blocking_comm(c, category, mb, chunk)

    def _blocking_comm(self, c: Comm, category: str, mb: int, chunk: int) -> None:
        deps = [] if self.last_compute is None else [self.last_compute]
        if self.pending_comm is not None:  # two collectives in a row: the second follows the first
            deps.append(self.pending_comm.idx)
        op = self.prog.add(OpKind.COLLECTIVE, STREAM_OF_AXIS[c.axis], self._comm_name(c.axis, c.coll), category="comm",
                           deps=tuple(deps), coll=c.coll, axis=c.axis, comm_bytes=c.size_bytes, microbatch=mb,
                           chunk=chunk)
        if c.overlap:  # the next compute segment runs beside it; the one after waits for it
            if self.overlap_comm is not None:  # an earlier one still unwaited: that compute waits for it too
                (self.extra_deps if self.overlap_skip == 0 else self.overlap_older).append(self.overlap_comm.idx)
            self.pending_comm, self.overlap_comm, self.overlap_skip = None, op, 1
        else:
            self.pending_comm = op

    def ring(self, r: Ring, category: str, mb: int, chunk: int) -> None:
        """Ring attention: compute block i while KV block i moves on; block i+1 waits for that move."""
        prev_comm = self.pending_comm
        for i in range(r.steps):
            recv = prev_comm
            if i < r.steps - 1 and r.comm is not None:
                deps = [d.idx for d in (prev_comm,) if d is not None] or (
                    [] if self.last_compute is None else [self.last_compute])
                prev_comm = self.prog.add(OpKind.COLLECTIVE, STREAM_OF_AXIS[r.comm.axis],
                                          self._comm_name(r.comm.axis, r.comm.coll), category="comm",
                                          deps=tuple(deps),
                                          coll=r.comm.coll, axis=r.comm.axis, comm_bytes=r.comm.size_bytes,
                                          microbatch=mb, chunk=chunk)
            self.pending_comm = recv
            self.compute(r.kernels, category, mb, chunk)
        self.pending_comm = None

    def compute(self, kernels: tuple[KernelDesc, ...], category: str, mb: int, chunk: int,
                mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> Op | None:
        """A compute op (or, with TP overlap pending, a chunked comm/compute pipeline)."""
        if not kernels:
            return None
        if self.pending_comm_spec is not None:
            return self._overlapped(kernels, category, mb, chunk, mem_start, mem_end, tag)
        deps = list(self.extra_deps)
        if self.pending_comm is not None:
            deps.append(self.pending_comm.idx)
            self.pending_comm = None
        if self.overlap_comm is not None:
            if self.overlap_skip:
                self.overlap_skip -= 1
            else:
                deps += [*self.overlap_older, self.overlap_comm.idx]
                self.overlap_comm, self.overlap_older = None, []
        self.extra_deps = []
        op = self.prog.add(OpKind.COMPUTE, Stream.COMPUTE, self._name(kernels, category), category=category,
                           deps=tuple(deps), kernels=kernels, microbatch=mb, chunk=chunk,
                           mem_start=((tag, mem_start),) if mem_start else (),
                           mem_end=((tag, mem_end),) if mem_end else (),
                           sync_before=self.sync_recv and self.recv_key is not None)
        if self.recv_key is not None:
            self.recv_ops[op.idx] = self.recv_key
            self.recv_key = None
        self.last_compute = op.idx
        return op

    def _name(self, kernels: tuple[KernelDesc, ...], category: str) -> str:
        """The op name of a compute op's kernels; memoised per kernel tuple (a layer plan's segments are
        emitted once per micro-batch and layer)."""
        return _by_identity(self._names, kernels, (id(kernels), category), lambda: (
            kernels[0].name if len(kernels) == 1 else f"{category}:{kernels[0].name}..{kernels[-1].name}"))

    def _comm_name(self, axis: str, coll: object) -> str:
        """``f"{axis}.{coll}"``, memoised per collective object (``Collective.__str__`` is not free)."""
        return _by_identity(self._comm_names, coll, (axis, id(coll)), lambda: f"{axis}.{coll}")

    def _split(self, kernels: tuple[KernelDesc, ...], gathered: bool, scattered: bool
               ) -> tuple[tuple[KernelDesc, ...], ...]:
        """(head, mid, tail) of ``kernels`` for ``_overlapped``: the leading GEMMs a preceding all-gather
        feeds (``gathered``), the rest, the trailing GEMMs that feed a following reduce-scatter
        (``scattered``); memoised per kernel tuple, so the slices are the same objects each time."""
        def split() -> tuple[tuple[KernelDesc, ...], ...]:
            lead = leading_gemms(kernels, gathered=True) if gathered else 0
            trail = leading_gemms(kernels[::-1]) if scattered else 0
            if lead == len(kernels) or trail == len(kernels):
                return (kernels,)
            return kernels[:lead], kernels[lead:len(kernels) - trail], kernels[len(kernels) - trail:]

        return _by_identity(self._splits, kernels, (id(kernels), gathered, scattered), split)

    def _sliced(self, kernels: tuple[KernelDesc, ...]) -> tuple[KernelDesc, ...]:
        """Each kernel of ``kernels`` as a 1/``TP_OVERLAP_CHUNKS`` slice, memoised per kernel tuple."""
        return _by_identity(self._parts, kernels, id(kernels),
                            lambda: tuple(sliced(k, TP_OVERLAP_CHUNKS) for k in kernels))

    def _overlapped(self, kernels: tuple[KernelDesc, ...], category: str, mb: int, chunk: int,
                    mem_start: float, mem_end: float, tag: str, after: Comm | None = None) -> Op | None:
        """TP communication overlap (Megatron ``--tp-comm-overlap``, Transformer Engine userbuffers;
        torch async TP): a collective pipelines only with the GEMMs it is fused with. A preceding
        all-gather feeds the segment's leading GEMMs (TE ``LayerNormLinear`` QKV / FC1 with
        ``ub_overlap_ag``; torch ``fused_all_gather_matmul``; in backward the dgrad GEMM that reads the
        gathered output gradient, ``leading_gemms(gathered=True)``), a following reduce-scatter is fed
        by its trailing GEMMs (``ub_overlap_rs``; ``fused_matmul_reduce_scatter``). Kernels between them (RoPE, core attention, the activation)
        run on their own: a collective next to one of those waits for it or is waited for."""
        before = self.pending_comm_spec
        self.pending_comm_spec = None
        split = self._split(kernels, before is not None, after is not None)
        if len(split) == 1:
            return self._pipelined(kernels, before, after, category, mb, chunk, mem_start, mem_end, tag)
        head, mid, tail = split
        op = None
        if before is not None and not head:
            self._blocking_comm(before, category, mb, chunk)
        if head:
            op = self._pipelined(head, before, None, category, mb, chunk, mem_start, 0.0, tag)
            mem_start = 0.0
        op = self.compute(mid, category, mb, chunk, mem_start, 0.0 if tail else mem_end, tag) or op
        if tail:
            op = self._pipelined(tail, None, after, category, mb, chunk, 0.0, mem_end, tag)
        elif after is not None:
            self._blocking_comm(after, category, mb, chunk)
        return op

    def _pipelined(self, kernels: tuple[KernelDesc, ...], before: Comm | None, after: Comm | None, category: str,
                   mb: int, chunk: int, mem_start: float, mem_end: float, tag: str) -> Op | None:
        """The kernels split in ``TP_OVERLAP_CHUNKS``: chunk i of ``before`` (an all-gather) feeds compute
        chunk i, and compute chunk i feeds chunk i of ``after`` (a reduce-scatter). Each compute chunk
        runs a 1/n slice of every kernel (``kernels.Sliced``: the cost pass gives it 1/n of the time)."""
        n = TP_OVERLAP_CHUNKS
        part = self._sliced(kernels)
        producer = () if self.last_compute is None else (self.last_compute,)
        # the all-gather chunks are issued first: the TP stream runs in order, so a reduce-scatter
        # chunk waiting for its GEMM chunk must not hold back the next all-gather chunk
        gathers = [] if before is None else [
            self.prog.add(OpKind.COLLECTIVE, Stream.TP, self._comm_name("tp", before.coll), category="comm",
                          deps=producer,
                          coll=before.coll, axis="tp", comm_bytes=before.size_bytes / n, microbatch=mb, chunk=chunk,
                          host_issued=False)
            for _ in range(n)]
        op = None
        for i in range(n):
            if gathers:
                self.pending_comm = gathers[i]
            op = self.compute(part, category, mb, chunk, mem_start if i == 0 else 0.0,
                              mem_end if i == n - 1 else 0.0, tag)
            if after is not None and op is not None:
                self.trailing.append(self.prog.add(
                    OpKind.COLLECTIVE, Stream.TP, self._comm_name("tp", after.coll), category="comm", deps=(op.idx,),
                    coll=after.coll, axis="tp", comm_bytes=after.size_bytes / n, microbatch=mb, chunk=chunk,
                    host_issued=False))
        if after is not None and self.trailing:
            self.pending_comm = self.trailing[-1]  # the next compute waits for the last chunk
            self.trailing = []
        return op

    def segments(self, segs: list[Segment], category: str, mb: int, chunk: int,
                 mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> None:
        """Emit a segment list; ``mem_start`` goes on its first compute op, ``mem_end`` on its last."""
        for _ in self.segment_steps(segs, category, mb, chunk, mem_start, mem_end, tag):
            pass

    def segment_steps(self, segs: list[Segment], category: str, mb: int, chunk: int,
                      mem_start: float = 0.0, mem_end: float = 0.0, tag: str = "activations") -> Iterator[None]:
        """``segments``, pausing after each compute segment (to interleave two chains, as DualPipe)."""
        computes = [i for i, s in enumerate(segs) if isinstance(s, tuple) and s]
        done = -1
        for i, s in enumerate(segs):
            if i == done:
                continue
            if _fused_with_next(segs, i, self.tp_overlap):
                nxt = segs[i + 1]
                assert isinstance(s, tuple) and isinstance(nxt, Comm)
                # a reduce-scatter/all-reduce of this segment's output pipelines with it
                self._overlapped(s, category, mb, chunk, mem_start if i == computes[0] else 0.0,
                                 mem_end if i == computes[-1] else 0.0, tag, after=nxt)
                done = i + 1
                yield
                continue
            if isinstance(s, Comm):
                self.comm(s, category, mb, chunk)
            elif isinstance(s, Ring):
                self.ring(s, category, mb, chunk)
                yield
            elif s:
                self.compute(s, category, mb, chunk, mem_start if i == computes[0] else 0.0,
                             mem_end if i == computes[-1] else 0.0, tag)
                yield


def _fused_with_next(segs: list[Segment], i: int, tp_overlap: bool) -> bool:
    """Whether compute segment i pipelines with the reduce-scatter/all-reduce of its output after it."""
    s, nxt = segs[i], segs[i + 1] if i + 1 < len(segs) else None
    return bool(isinstance(s, tuple) and s and isinstance(nxt, Comm) and nxt.fused_with_gemm(tp_overlap)
                and nxt.coll.kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE))


def segment_marks(segs: list[Segment], tp_overlap: bool) -> list[tuple[bool, bool]]:
    """One (carries ``mem_start``, carries ``mem_end``) per step ``_Emitter.segment_steps`` pauses after
    for ``segs``: the granularity at which DualPipe's overlapped pair interleaves its two chains
    (``_StageLowering.run_pair``), so the closed-form peak (``memory.closed_form_peak``) interleaves
    their memory deltas exactly as the ledger sees them."""
    computes = [i for i, s in enumerate(segs) if isinstance(s, tuple) and s]
    if not computes:
        return []
    first, last = computes[0], computes[-1]
    out: list[tuple[bool, bool]] = []
    done = -1
    for i, s in enumerate(segs):
        if i == done:
            continue
        if _fused_with_next(segs, i, tp_overlap):
            out.append((i == first, i == last))
            done = i + 1
        elif isinstance(s, Ring):
            out.append((False, False))
        elif isinstance(s, tuple) and s:
            out.append((i == first, i == last))
    return out


def per_step(segs: list[Segment], tp_overlap: bool | None, start: float, end: float) -> list[tuple[float, float]]:
    """The (start, end) deltas of ``segs`` emitted with ``mem_start=start, mem_end=end``: one entry per
    step of ``segment_marks`` (zeros where a step carries neither), or one entry when ``tp_overlap`` is
    None (a sequential walk needs no steps)."""
    marks = segment_marks(segs, tp_overlap) if tp_overlap is not None else []
    if not marks:
        return [(start, end)]
    return [(start if a else 0.0, end if b else 0.0) for a, b in marks]


@dataclass(frozen=True, slots=True)
class EdgeSegments:
    """The embedding's and the head's segments and the TP-overlap flag: what ``chunk_memory`` needs to
    give its deltas one entry per emission step (``segment_marks``)."""

    tp_overlap: bool
    embedding_fwd: list[Segment]
    embedding_bwd: list[Segment]
    head_fwd: list[Segment]
    head_bwd: list[Segment]


def edge_segments(block: BlockBuilder, layout: LayoutConfig) -> EdgeSegments:
    """``EdgeSegments`` of a block builder."""
    return EdgeSegments(tp_overlap_on(layout), block.embedding_forward(), block.embedding_backward(),
                        block.head_forward(), block.head_backward())
