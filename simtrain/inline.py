"""Which communication ops the compute stream can run in line (an engine fast path, exact).

A blocking collective (tensor-parallel all-gather/reduce-scatter without comm overlap) starts when
compute op X ends, and the next compute op Z waits for it, so the compute stream is idle for exactly
its duration. When the collective is also *private* (no other stream ever touches its edges, so its
time is known offline: ``Engine._prepare_comm``), running it as a timeout on the compute stream,
between X and Z, gives every op the same start and end times with about a third of the simpy events
(no hand-off to the comm stream and back). This module finds those ops; the engine runs them.

The rules keep the times identical: the group G of ops Z waits for is one contiguous run of a single
comm stream; its first op depends on X; the op before G on that stream has finished before X ends
(it is in line too, or a compute op at or before X waited for it); and the op after G cannot start
before G ends (it depends on a member of G or on a compute op from Z on). Z has no pipeline receive
(its idle time would then be split between bubble and tensor-parallel time differently).

A collective whose edges another stream of the same rank also uses (a data-parallel bucket on the same
NVLink ports) is still private *where* none of that stream's ops can be in flight: ``time_bounds``
brackets every comm op between compute-stream positions (it starts after compute op L ends and ends
before compute op H starts), and a ``Window`` says at which gaps of the compute stream some such op
may be running. Gradient buckets, for example, only run during the last micro-batch's backward, so
the tensor-parallel collectives of every other micro-batch run in line.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from simtrain.ops import Op, OpKind, Stream

Inline = dict[int, tuple[tuple[Op, ...], tuple[int, ...]]]
"""Compute op index -> (comm ops to run in line before it, in order; its remaining deps)."""


NEVER = 1 << 62  # a position after every compute op


@dataclass(frozen=True, slots=True)
class Window:
    """Where ops of other streams sharing an op's edges may be in flight, as compute-stream gaps.

    Built from their (L, H) brackets (``time_bounds``): such an op can overlap the gap between compute
    ops k-1 and k only if L <= k-1 and H >= k.
    """

    his: tuple[int, ...]
    """H of the conflicting ops, ascending."""
    min_lo: tuple[int, ...]
    """min L over the ops from that index on (suffix minimum)."""

    @classmethod
    def of(cls, brackets: Sequence[tuple[int, int]]) -> Window:
        """The window of conflicting ops with brackets (L, H)."""
        ordered = sorted(brackets, key=lambda b: b[1])
        mins, low = [], NEVER
        for lo, _ in reversed(ordered):
            low = min(low, lo)
            mins.append(low)
        return cls(tuple(h for _, h in ordered), tuple(reversed(mins)))

    def clear(self, k: int) -> bool:
        """Whether no conflicting op can be in flight between compute ops k-1 and k."""
        j = bisect_left(self.his, k)
        return j == len(self.his) or self.min_lo[j] >= k


def time_bounds(ops: Sequence[Op]) -> tuple[list[int], list[int]]:
    """(L, H) per op: a comm op starts after compute op L ends (-1: no bound) and ends before compute op
    H starts (NEVER: no bound), from its deps, its stream neighbours and the compute ops that wait for
    it (compute-stream positions; compute ops get -1 / NEVER)."""
    n = len(ops)
    pos = [-1] * n
    k = 0
    for op in ops:
        if op.stream == Stream.COMPUTE:
            pos[op.idx] = k
            k += 1
    lo, hi = [-1] * n, [NEVER] * n
    last: dict[Stream, int] = {}
    for op in ops:
        if op.stream == Stream.COMPUTE:
            for d in op.deps:
                if pos[d] < 0 and pos[op.idx] < hi[d]:
                    hi[d] = pos[op.idx]
            continue
        b = lo[last[op.stream]] if op.stream in last else -1
        for d in op.deps:
            b = max(b, pos[d] if pos[d] >= 0 else lo[d])
        lo[op.idx] = b
        last[op.stream] = op.idx
    after: dict[Stream, int] = {}
    for op in reversed(ops):
        if op.stream == Stream.COMPUTE:
            continue
        i = op.idx
        if op.stream in after:
            hi[i] = min(hi[i], hi[after[op.stream]])
        for d in op.deps:
            if pos[d] < 0 and hi[i] < hi[d]:
                hi[d] = hi[i]
        after[op.stream] = i
    return lo, hi


def inline_plan(ops: Sequence[Op], private_s: Sequence[float | None],
                windows: Sequence[Window | None] | None = None) -> Inline:
    """The in-line comm ops of one program (symmetric mode).

    Args:
        ops: the program's ops (``Program.ops``; ``ops[i].idx == i``).
        private_s: per op index, its offline duration in seconds when it may run in line, else None.
        windows: per op index, where it may not (ops of other streams on its edges in flight), or None.
    """
    n = len(ops)
    pos = [-1] * n  # position of a compute op on the compute stream; -1 for comm ops
    slot = [0] * n  # position of an op on its own stream
    order: dict[Stream, list[int]] = {}
    for op in ops:
        lst = order.setdefault(op.stream, [])
        slot[op.idx] = len(lst)
        lst.append(op.idx)
    compute = order.get(Stream.COMPUTE, [])
    for k, i in enumerate(compute):
        pos[i] = k
    waited = [n] * n  # first compute position that depends on an op
    for k, i in enumerate(compute):
        for d in ops[i].deps:
            if waited[d] == n:
                waited[d] = k
    plan: Inline = {}
    inlined = [False] * n
    for k in range(1, len(compute)):
        z = ops[compute[k]]
        if z.remote is not None:
            continue
        group = _group(ops, z, pos, k, private_s, inlined, windows)
        if group is None or compute[k - 1] not in ops[group[0]].deps:
            continue  # the first op must start when X (the compute op before z) ends
        if not _stream_clear(ops, group, order[ops[group[0]].stream], slot, waited, inlined, pos, k):
            continue
        for i in group:
            inlined[i] = True
        plan[z.idx] = (tuple(ops[i] for i in group), tuple(d for d in z.deps if pos[d] >= 0))
    return plan


def _group(ops: Sequence[Op], z: Op, pos: list[int], k: int, private_s: Sequence[float | None],
           inlined: list[bool], windows: Sequence[Window | None] | None) -> list[int] | None:
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
        if (op.kind != OpKind.COLLECTIVE or op.remote is not None or op.stream != stream or inlined[i]
                or private_s[i] is None):
            return None
        w = windows[i] if windows is not None else None
        if w is not None and not w.clear(k):
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
