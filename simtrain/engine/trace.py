"""Chrome/Perfetto trace export of a simulated step (one track per simulated GPU and stream).

The output follows the Trace Event Format (Google, "Trace Event Format", the JSON Object Format with
``traceEvents``; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):

- ``"ph": "X"`` complete events, one per executed op (``ts``/``dur`` in microseconds), with ``args``:
  category, micro-batch, bytes (a collective's nccl-tests size, a send's payload), kernels; a
  collective's ``collective`` kind, ``group`` (axis, size, ranks up to ``MAX_LISTED_RANKS``) and
  ``algorithm`` (as the planner chose it); a send's ``to_rank``, a waiting op's ``from_rank``;
- ``"ph": "C"`` counter events, each stage's allocated memory over the step (GiB, before the
  fragmentation allowance), on the process of the stage's first simulated rank; it is the memory
  timeline of ``StepResult.memory`` (in full mode the stage's busiest rank's);
- ``"ph": "s"`` / ``"ph": "f"`` flow events (same ``id``), an arrow from each pipeline send to the op
  of the peer stage that waits for it (forward activations and backward gradients alike); the
  finish binds to its enclosing slice (``"bp": "e"``);
- ``"ph": "M"`` metadata naming processes (ranks) and threads (streams).

A path ending in ``.gz`` is written gzip-compressed (ui.perfetto.dev's trace processor reads gzip).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simtrain.engine.records import TraceEvent
from simtrain.engine.results import StageMemory
from simtrain.lower.ops import CollectiveOp, CommOp, ComputeOp, CopyOp, OpKind, SendOp, Stream

US_PER_S = 1e6  # the Chrome trace format counts microseconds
GiB = 1024.0**3
MAX_LISTED_RANKS = 64
"""A collective's ``args.group.ranks`` lists its ranks up to this group size (larger: size only)."""


def _op_args(e: TraceEvent) -> dict[str, Any]:
    """``args`` of one op's complete event."""
    op = e.op
    args: dict[str, Any] = {"category": e.category}
    if op.microbatch >= 0:
        args["microbatch"] = op.microbatch
    if isinstance(op, CommOp | CopyOp) and op.comm_bytes:
        args["bytes"] = op.comm_bytes
    if isinstance(op, ComputeOp) and op.kernels:
        args["hw_flops"] = op.flops
        args["kernels"] = [k.name for k in op.kernels]
    if isinstance(op, CollectiveOp):
        assert op.coll is not None
        args["collective"] = op.coll.kind.value
        if (limited := op.coll.node_limited) is not None:  # the deduplicated all-to-all's routing
            args["node_limited"] = {"max_nodes": limited.max_nodes, "top_k": limited.top_k,
                                    "n_experts": limited.n_experts}
        group: dict[str, Any] = {"axis": op.axis, "size": len(e.group)}
        if len(e.group) <= MAX_LISTED_RANKS:
            group["ranks"] = list(e.group)
        args["group"] = group
        if e.algorithm:
            args["algorithm"] = e.algorithm
    elif isinstance(op, SendOp):
        args["to_rank"] = e.peer
        args["to_stage"] = op.peer_stage
    if op.remote is not None:
        args["from_rank"] = e.peer
        args["from_stage"] = op.remote[0]
    return args


def _memory_counters(memory: Sequence[StageMemory], stage_of: dict[int, int]) -> list[dict[str, Any]]:
    """One counter track per stage: its allocated GiB at every change (the last value of each instant)."""
    first: dict[int, int] = {}  # stage -> its lowest simulated rank
    for r, s in sorted(stage_of.items()):
        first.setdefault(s, r)
    out: list[dict[str, Any]] = []
    for m in memory:
        if m.stage not in first:
            continue
        points: dict[float, float] = {}
        for t, total in m.timeline:  # several deltas at one instant: the level after the last one
            points[t] = total
        last = None
        for t, total in points.items():
            if total == last:
                continue
            last = total
            out.append({"ph": "C", "name": "memory allocated (GiB)", "pid": first[m.stage], "ts": t * US_PER_S,
                        "args": {f"stage {m.stage}": total / GiB}})
    return out


def _flows(events: list[TraceEvent], streams: dict[str, int]) -> list[dict[str, Any]]:
    """A flow arrow from each pipeline send to each op that waits for it (the receive). Both ends sit
    at their slice's midpoint, so each binds to that slice (a boundary instant touches two)."""
    sends = {(e.rank, e.op.idx): e for e in events if e.op.kind == OpKind.SEND}
    out: list[dict[str, Any]] = []
    flow_id = 0
    for e in events:
        if e.op.remote is None:
            continue
        src = sends.get((e.peer, e.op.remote[1]))
        if src is None:
            continue
        flow_id += 1
        name = f"pp {src.name}"
        out.append({"ph": "s", "id": flow_id, "name": name, "cat": "pp", "pid": src.rank, "tid": streams[src.stream],
                    "ts": (src.start_s + src.end_s) / 2 * US_PER_S})
        out.append({"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": "pp", "pid": e.rank,
                    "tid": streams[e.stream], "ts": (e.start_s + e.end_s) / 2 * US_PER_S})
    return out


def to_chrome_trace(events: list[TraceEvent], stage_of: dict[int, int],
                    memory: Sequence[StageMemory] = ()) -> dict[str, Any]:
    """Trace Event Format dict: pid = simulated rank (GPU), tid = stream; ``memory``: the stages'
    memory (``StepResult.memory``) for the counter tracks (none when empty)."""
    streams = {s.name.lower(): int(s) for s in Stream}  # every stream the engine has, one thread each
    out: list[dict[str, Any]] = []
    for r, s in sorted(stage_of.items()):
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} (stage {s})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for name, tid in streams.items():
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
    for e in events:
        out.append({"ph": "X", "name": e.name, "cat": e.category, "pid": e.rank, "tid": streams[e.stream],
                    "ts": e.start_s * US_PER_S, "dur": (e.end_s - e.start_s) * US_PER_S, "args": _op_args(e)})
    out += _flows(events, streams)
    out += _memory_counters(memory, stage_of)
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text, or bytes as they are) to ``path`` atomically (temporary file in the same
    folder, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file a normal file's mode
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_chrome_trace(path: str | Path, events: list[TraceEvent], stage_of: dict[int, int],
                       memory: Sequence[StageMemory] = ()) -> None:
    """Write the trace JSON atomically; gzip-compressed when ``path`` ends in ``.gz`` (no timestamp in
    the gzip header, so the same step writes the same bytes)."""
    text = json.dumps(to_chrome_trace(events, stage_of, memory))
    if str(path).endswith(".gz"):
        write_atomic(path, gzip.compress(text.encode(), mtime=0))
    else:
        write_atomic(path, text)
