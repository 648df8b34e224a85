"""Chrome/Perfetto trace export of a simulated step (one track per simulated GPU and stream)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from simtrain.engine import TraceEvent
from simtrain.ops import Stream

US_PER_S = 1e6  # the Chrome trace format counts microseconds


def to_chrome_trace(events: list[TraceEvent], stage_of: dict[int, int]) -> dict[str, Any]:
    """Trace Event Format dict: pid = simulated rank (GPU), tid = stream."""
    streams = {s.name.lower(): int(s) for s in Stream}  # every stream the engine has, one thread each
    out: list[dict[str, Any]] = []
    for r, s in sorted(stage_of.items()):
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} (stage {s})"}})
        for name, tid in streams.items():
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
    for e in events:
        args: dict[str, Any] = {"category": e.category}
        if e.op.microbatch >= 0:
            args["microbatch"] = e.op.microbatch
        if e.op.comm_bytes:
            args["bytes"] = e.op.comm_bytes
        if e.op.kernels:
            args["hw_flops"] = e.op.flops
            args["kernels"] = [k.name for k in e.op.kernels]
        out.append({"ph": "X", "name": e.name, "cat": e.category, "pid": e.rank, "tid": streams[e.stream],
                    "ts": e.start_s * US_PER_S, "dur": (e.end_s - e.start_s) * US_PER_S, "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file a normal file's mode
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_chrome_trace(path: str | Path, events: list[TraceEvent], stage_of: dict[int, int]) -> None:
    """Write the trace JSON atomically."""
    write_atomic(path, json.dumps(to_chrome_trace(events, stage_of)))
