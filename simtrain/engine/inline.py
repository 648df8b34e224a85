"""Which communication ops the compute stream runs itself (an engine fast path, exact).

A blocking collective (tensor-parallel all-gather/reduce-scatter without comm overlap) starts when
compute op X ends, and the next compute op Z waits for it, so the compute stream is idle for exactly
its duration. Run by the compute stream itself, between X and Z (as NCCL kernels on the compute
stream are, without comm overlap), it has the same start and end times, with no hand-off to its comm
stream and back. ``inline_plan`` finds those ops; the engine runs them: as a plain timeout of its
offline time when no other flow can share its edges then, else as flows on the network.

The rules keep the times identical: the group G of ops Z waits for is one contiguous run of a single
comm stream; its first op depends on X; the op before G on that stream has finished before X ends
(it is in line too, or a compute op at or before X waited for it); and the op after G cannot start
before G ends (it depends on a member of G or on a compute op from Z on). Z has no pipeline receive
(its idle time would then be split between bubble and tensor-parallel time differently).

When may an op in line skip the network? When no other stream ever uses its edges (private), or
when the only other streams that do are its own rank's and none of their ops that share its edges
can be in flight (``Guard``): ``time_bounds`` gives each comm op the compute position L after which
it can start, and ops of one stream finish in order, so at gap k (between compute ops k-1 and k)
the check is that the stream has finished every such op with L <= k-1; those with L >= k start after
Z. Gradient buckets, for example, are issued only in the last micro-batch's backward, so the
tensor-parallel collectives of every other micro-batch skip the network.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simtrain.engine.records import _Sharing
from simtrain.lower.ops import Op, OpKind, Stream

Inline = dict[int, tuple[tuple[Op, ...], tuple[int, ...]]]
"""Compute op index -> (comm ops the compute stream runs before it, in order; its remaining deps)."""


@dataclass(frozen=True, slots=True)
class Guard:
    """Ops of other streams of the same rank that share an op's edges, per stream: their L
    (``time_bounds``, ascending) and how many ops that stream has run once each is done."""

    streams: tuple[tuple[Stream, tuple[int, ...], tuple[int, ...]], ...]

    def clear(self, k: int, finished: Mapping[Stream, int]) -> bool:
        """Whether none of those ops can be in flight between compute ops k-1 and k, given how many
        ops each stream has finished now."""
        for stream, los, counts in self.streams:
            j = bisect_right(los, k - 1)
            if j and finished.get(stream, 0) < counts[j - 1]:
                return False
        return True


def time_bounds(ops: Sequence[Op]) -> list[int]:
    """L per op: a comm op starts after compute op L ends (compute-stream positions; -1: no bound),
    from its deps and its stream predecessor. Compute ops get -1."""
    n = len(ops)
    pos = _compute_positions(ops)
    lo = [-1] * n
    last: dict[Stream, int] = {}
    for op in ops:
        if op.stream == Stream.COMPUTE:
            continue
        b = lo[last[op.stream]] if op.stream in last else -1
        for d in op.deps:
            b = max(b, pos[d] if pos[d] >= 0 else lo[d])
        lo[op.idx] = b
        last[op.stream] = op.idx
    return lo


def _compute_positions(ops: Sequence[Op]) -> list[int]:
    """Per op index, its position on the compute stream (-1 for comm ops)."""
    pos = [-1] * len(ops)
    k = 0
    for op in ops:
        if op.stream == Stream.COMPUTE:
            pos[op.idx] = k
            k += 1
    return pos


def inline_plan(ops: Sequence[Op]) -> Inline:
    """The comm ops of one program that its compute stream runs itself (symmetric mode).

    Args:
        ops: the program's ops (``Program.ops``; ``ops[i].idx == i``).
    """
    n = len(ops)
    slot = [0] * n  # position of an op on its own stream
    order: dict[Stream, list[int]] = {}
    for op in ops:
        lst = order.setdefault(op.stream, [])
        slot[op.idx] = len(lst)
        lst.append(op.idx)
    compute = order.get(Stream.COMPUTE, [])
    pos = _compute_positions(ops)
    waited = [n] * n  # first compute position that depends on an op
    for k, i in enumerate(compute):
        for d in ops[i].deps:
            if waited[d] == n:
                waited[d] = k
    plan: Inline = {}
    inlined = [False] * n
    for k in range(1, len(compute)):
        z = ops[compute[k]]
        if z.remote is not None or not z.deps:  # no deps: no comm op to run (``_group`` would say None)
            continue
        group = _group(ops, z, pos, k, inlined)
        if group is None or compute[k - 1] not in ops[group[0]].deps:
            continue  # the first op must start when X (the compute op before z) ends
        if not _stream_clear(ops, group, order[ops[group[0]].stream], slot, waited, inlined, pos, k):
            continue
        for i in group:
            inlined[i] = True
        plan[z.idx] = (tuple(ops[i] for i in group), tuple(d for d in z.deps if pos[d] >= 0))
    return plan


def _group(ops: Sequence[Op], z: Op, pos: list[int], k: int, inlined: list[bool]) -> list[int] | None:
    """The comm ops ``z`` waits for (with their comm deps), if all qualify; sorted by issue order."""
    stack = [d for d in z.deps if pos[d] < 0]
    if not stack:
        return None
    seen: set[int] = set()
    stream = ops[stack[0]].stream
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        op = ops[i]
        if op.kind != OpKind.COLLECTIVE or op.remote is not None or op.stream != stream or inlined[i]:
            return None
        for d in op.deps:
            p = pos[d]
            if p < 0:
                stack.append(d)
            elif p >= k:
                return None
        seen.add(i)
    return sorted(seen)


def _stream_clear(ops: Sequence[Op], group: list[int], lst: list[int], slot: list[int], waited: list[int],
                  inlined: list[bool], pos: list[int], k: int) -> bool:
    """Whether ``group`` is a contiguous run of its stream (``lst``), free to start when X ends and not
    overtaken by the op after it once taken off the stream."""
    first, last = slot[group[0]], slot[group[-1]]
    if last - first + 1 != len(group):  # one stream, issue order: contiguous iff no gap in slots
        return False
    if first > 0:
        prev = lst[first - 1]
        if not inlined[prev] and waited[prev] > k - 1:
            return False
    if last + 1 < len(lst):
        return any(pos[d] >= k or d in group for d in ops[lst[last + 1]].deps)
    return True


def in_line_costs(rank: int, ops: Sequence[Op], inline: Inline, table: Sequence[Any], sig_of: Sequence[int],
                  sharing: _Sharing, alone_s: Callable[[Any], float]) -> tuple[dict[int, float], dict[int, Guard]]:
    """Which of ``rank``'s in-line comm ops may skip the network, and their time alone (seconds): the private
    ones always; those whose edges only other streams of this rank share, where their Guard is clear.
    ``inline``: the rank's in-line plan; ``table``: its comm entries by signature (``sig_of``: op -> signature),
    whose fourth item is the private time alone or None; ``alone_s``: an entry's time on an empty network."""
    moved = {op.idx for pre, _ in inline.values() for op in pre}
    alone: dict[int, float] = {}
    guards: dict[int, Guard] = {}
    count: dict[int, int] = {}  # op -> ops its stream has run once it is done
    runs: dict[Stream, int] = defaultdict(int)
    for op in ops:
        if op.stream != Stream.COMPUTE and op.idx not in moved:
            runs[op.stream] += 1
            count[op.idx] = runs[op.stream]
    lo: list[int] | None = None
    mine_uses = [u for u in sharing.uses if u[0] == rank]
    for _, idxs, entry, owner in mine_uses:
        here = [i for i in idxs if i in moved]
        if not here:
            continue
        private = table[sig_of[here[0]]][3]
        if private is not None:
            alone.update((i, private) for i in here)
            continue
        edges = sharing.edges_of[(id(entry), owner)]
        others = {o for e in edges for o in sharing.owners[e]} - {owner}
        if any(o[1] != rank for o in others):
            continue  # another rank's stream: only the network knows when its flows run
        if lo is None:
            lo = time_bounds(ops)
        per_stream: dict[Stream, list[int]] = defaultdict(list)
        for _, idxs2, entry2, owner2 in mine_uses:
            if owner2 in others and not edges.isdisjoint(sharing.edges_of[(id(entry2), owner2)]):
                for i in idxs2:
                    if i not in moved:
                        per_stream[ops[i].stream].append(i)
        guard = Guard(tuple((s, tuple(lo[i] for i in v), tuple(count[i] for i in v))
                            for s, v in ((s, sorted(v)) for s, v in per_stream.items())))
        duration = alone_s(entry)
        for i in here:
            alone[i], guards[i] = duration, guard
    return alone, guards
