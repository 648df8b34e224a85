"""The measurement journal: every result appended (JSON lines) as soon as it is measured.

``measurements.jsonl`` sits beside the profile it feeds. Its first line is a header naming the
device it was measured on (``fingerprint``); every other line is one measurement::

    {"key": "gemm|{...}", "kind": "gemm", "params": {...}, "status": "ok", "stats": {...}, ...}

A calibration that is interrupted (killed, a rank failed, the machine rebooted) is resumed by
running the same command again: measurements whose key is already in the journal are skipped. A
line cut short by the interruption is ignored. Appends are flushed and fsync'd one by one, so at
most the measurement in flight is lost. The profile itself is rebuilt from the whole journal and
written atomically (``calibration.writer``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from simtrain.engine.trace import write_atomic


class JournalMismatch(RuntimeError):
    """The journal on disk was measured on another device or software stack."""


def measurement_key(kind: str, params: dict[str, Any]) -> str:
    """A stable key for one measurement: its kind and its parameters (sorted JSON)."""
    return f"{kind}|{json.dumps(params, sort_keys=True, separators=(',', ':'))}"


class Journal:
    """Append-only JSON-lines record of one profile's measurements.

    Args:
        path: the ``measurements.jsonl`` file.
        header: description of the device and settings; ``header["fingerprint"]`` must match the
            journal's when resuming.
        fresh: discard an existing journal instead of resuming it.

    Raises:
        JournalMismatch: resuming a journal whose fingerprint differs (use ``fresh``).
    """

    def __init__(self, path: Path, header: dict[str, Any], fresh: bool = False):
        self.path = path
        self.header = header
        self._records: dict[str, dict[str, Any]] = {}
        if fresh and path.exists():
            path.unlink()
        if path.exists():
            self._load()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"type": "header", **header})

    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        parsed = []
        for i, line in enumerate(lines):
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                if i < len(lines) - 1:  # only the last line may be cut short by an interruption
                    raise JournalMismatch(f"{self.path}: line {i + 1} is corrupt; start over with --fresh") from None
                # drop the cut line, so that what is appended next starts a line of its own
                write_atomic(self.path, "".join(line + "\n" for line in lines[:-1]))
        if not parsed or parsed[0].get("type") != "header":
            raise JournalMismatch(f"{self.path}: no header line; start over with --fresh")
        old = parsed[0].get("fingerprint")
        if old != self.header.get("fingerprint"):
            raise JournalMismatch(f"{self.path} was measured on {old!r}, this is {self.header.get('fingerprint')!r}; "
                                  "use another --out name, or --fresh to discard it")
        self.header = {k: v for k, v in parsed[0].items() if k != "type"}
        for rec in parsed[1:]:
            if "key" in rec:
                self._records[rec["key"]] = rec

    def _append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def has(self, key: str) -> bool:
        """True when ``key`` was measured (whatever its status)."""
        return key in self._records

    def add(self, kind: str, params: dict[str, Any], status: str, stats: dict[str, Any] | None = None,
            **extra: Any) -> dict[str, Any]:
        """Append one measurement (status "ok", "oom" or "error") and return its record."""
        key = measurement_key(kind, params)
        rec = {"key": key, "kind": kind, "params": params, "status": status, "stats": stats or {},
               "t_unix": round(time.time(), 3), **extra}
        self._append(rec)
        self._records[key] = rec
        return rec

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Measurements in the journal (of one kind, if given), in the order they were measured."""
        return [r for r in self._records.values() if kind is None or r["kind"] == kind]
