"""The long fuzz campaign: thousands of random configurations and malformed inputs (issue 31, part 4).

    python benchmarks/fuzz.py --n 10000 --workers 2 --seed 1 --out fuzz.jsonl
    python benchmarks/fuzz.py --summary fuzz.jsonl          # the summary of a finished (or partial) run

Case ``i`` of seed ``S`` is drawn by ``benchmarks.fuzz_cases`` from ``random.Random("simtrain-fuzz:S:i")``
alone, so a run is resumable (indices already in ``--out`` are skipped) and any case can be rerun
(``--case i``). Each case runs in a worker process with a wall-clock limit (``--timeout``, 30 s) and an
address-space limit (``--mem-gib``): a case over either is killed and recorded, never waited on. Every
failure (crash, invariant break, timeout) gets a reproducer: its config or files are written under
``OUT.cases/`` and the summary prints the ``simtrain`` command line that replays it. Failures that a
line of ``KNOWN_OPEN`` or ``FOUND_BY_FUZZ`` (``benchmarks/fuzz_known.py``) matches are counted apart.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import shlex
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fuzz_cases import (  # noqa: E402 - after the path set-up, so the script runs from anywhere
    CASE_TIMEOUT_S,
    case_rng,
    known_bug,
    random_case,
    run_cli_case,
    run_config_case,
)

FAILURES = ("crash", "invariant", "timeout")


def make_case(seed: int, index: int, malformed_share: float) -> dict[str, Any]:
    """Case ``index`` of campaign ``seed``."""
    case = random_case(case_rng(seed, index), malformed_share)
    case["index"] = index
    return case


def run_case(case: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one case in this process (config cases check determinism on every 10th)."""
    if case["kind"] == "config":
        return run_config_case(case["config"], check_determinism=case["index"] % 10 == 0)
    return run_cli_case(case, workdir / f"case{case['index']}")


def _worker(conn: Connection, seed: int, share: float, mem_gib: float) -> None:
    import resource

    if mem_gib > 0:
        limit = int(mem_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import simtrain.cli.main  # noqa: F401 - imported before the first case so its wall time is the case's own
    import simtrain.studies.simulate  # noqa: F401
    import simtrain.validation.fidelity  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="simtrain-fuzz-"))
    while True:
        index = conn.recv()
        if index is None:
            return
        case = make_case(seed, index, share)
        try:
            result = run_case(case, work)
        except MemoryError:
            result = {"outcome": "crash", "detail": "MemoryError (over --mem-gib)", "wall_s": float("nan")}
        conn.send(result)


class _Slot:
    """One worker process and the case it is running."""

    def __init__(self, ctx: Any, seed: int, share: float, mem_gib: float):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, seed, share, mem_gib), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.started = 0.0

    def give(self, index: int) -> None:
        self.index, self.started = index, time.perf_counter()
        self.conn.send(index)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


def campaign(n: int, seed: int, out: Path, workers: int, timeout: float, mem_gib: float, share: float) -> None:
    """Run cases 0..n-1 of ``seed`` not yet in ``out``, appending one JSON line per case."""
    done = {r["index"] for r in read_results(out)}
    todo = [i for i in range(n) if i not in done]
    print(f"fuzz: seed {seed}, {len(done)} cases already in {out}, {len(todo)} to run on {workers} worker(s)",
          flush=True)
    ctx = mp.get_context("fork")
    slots = [_Slot(ctx, seed, share, mem_gib) for _ in range(max(1, workers))]
    queue = list(reversed(todo))
    started = time.perf_counter()
    finished = 0
    with out.open("a") as fh:
        def record(index: int, result: dict[str, Any]) -> None:
            nonlocal finished
            case = make_case(seed, index, share)
            row = {"index": index, "seed": seed, "share": share, "kind": case["kind"],
                   "label": case.get("label", "")} | result
            if row["outcome"] in FAILURES:
                row["known"] = known_bug(case, f"{row['outcome']}: {row.get('detail', '')}")
                row["repro"] = write_reproducer(case, out)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            finished += 1
            if finished % 100 == 0:
                rate = (time.perf_counter() - started) / finished
                print(f"  {finished}/{len(todo)} cases, {rate:.2f} s per case", flush=True)

        for slot in slots:
            if queue:
                slot.give(queue.pop())
        while any(s.index is not None for s in slots):
            busy = [s for s in slots if s.index is not None]
            now = time.perf_counter()
            left = min(timeout - (now - s.started) for s in busy)
            ready = wait([s.conn for s in busy], timeout=max(0.01, left))
            for i, slot in enumerate(slots):
                if slot.index is None:
                    continue
                index = slot.index
                if slot.conn in ready:
                    try:
                        result = slot.conn.recv()
                    except EOFError:  # the worker died (killed by the OS, a segfault)
                        result = {"outcome": "crash", "detail": f"worker died (exit code {slot.proc.exitcode})",
                                  "wall_s": time.perf_counter() - slot.started}
                        slot.stop()
                        slot = slots[i] = _Slot(ctx, seed, share, mem_gib)
                elif time.perf_counter() - slot.started >= timeout:
                    result = {"outcome": "timeout", "detail": f"timeout: still running after {timeout:g} s",
                              "wall_s": time.perf_counter() - slot.started}
                    slot.stop()
                    slot = slots[i] = _Slot(ctx, seed, share, mem_gib)
                else:
                    continue
                record(index, result)
                slot.index = None
                if queue:
                    slot.give(queue.pop())
    for slot in slots:
        slot.conn.send(None)
        slot.proc.join(timeout=5)
        slot.stop()


def write_reproducer(case: dict[str, Any], out: Path) -> str:
    """Write the case's config or files under ``OUT.cases/`` and return the command line replaying it."""
    import yaml

    root = out.with_name(out.name + ".cases")
    if case["kind"] == "config":
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{case['index']}.yaml"
        path.write_text(yaml.safe_dump(case["config"], sort_keys=False))
        return f"python -m simtrain.cli simulate {shlex.quote(str(path))} --json"
    folder = root / str(case["index"])
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case["files"].items():
        (folder / name).write_bytes(base64.b64decode(data))
    return f"cd {shlex.quote(str(folder))} && python -m simtrain.cli {shlex.join(case['argv'])}"


def read_results(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a campaign (a missing file is an empty campaign)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def reclassify(rows: list[dict[str, Any]], share: float) -> list[dict[str, Any]]:
    """Match every failure against today's KNOWN_OPEN and FOUND_BY_FUZZ (lines come and go between runs)."""
    for r in rows:
        if r["outcome"] in FAILURES:
            case = make_case(r["seed"], r["index"], r.get("share", share))
            r["known"] = known_bug(case, f"{r['outcome']}: {r.get('detail', '')}")
    return rows


def summary(rows: list[dict[str, Any]], slow_s: float = CASE_TIMEOUT_S) -> str:
    """Counts per outcome, new and known failures with reproducers, the slowest cases."""
    counts = Counter(r["outcome"] for r in rows)
    walls = [r["wall_s"] for r in rows if isinstance(r.get("wall_s"), float) and r["wall_s"] == r["wall_s"]]
    new = [r for r in rows if r["outcome"] in FAILURES and not r.get("known")]
    known = Counter(r["known"] for r in rows if r["outcome"] in FAILURES and r.get("known"))
    over = sum(1 for r in rows if r["outcome"] == "timeout" or (r.get("wall_s") or 0) > slow_s)
    kinds = Counter(r["kind"] for r in rows)
    lines = [f"{len(rows)} cases ({kinds['config']} configs, {kinds['cli']} malformed command lines): "
             f"{counts['ok']} ok, {counts['refused']} refused cleanly, {counts['crash']} crashes, "
             f"{counts['invariant']} invariant breaks, {counts['timeout']} timeouts; {over} over {slow_s:g} s",
             f"new failures: {len(new)}; known: {sum(known.values())} (issue 31's KNOWN_OPEN, and FOUND_BY_FUZZ "
             "marked [fuzz])"]
    if walls:
        walls.sort()
        lines.append(f"time per case: mean {sum(walls) / len(walls):.3f} s, median {walls[len(walls) // 2]:.3f} s, "
                     f"max {walls[-1]:.2f} s")
    for name, k in sorted(known.items(), key=lambda kv: (kv[0].startswith("[fuzz]"), -kv[1])):
        lines.append(f"  known x{k}: {name}")
    for r in new:
        lines.append(f"  NEW {r['outcome']} case {r['index']} ({r['kind']} {r.get('label', '')}): "
                     f"{str(r.get('detail', '')).strip().splitlines()[-1][:300] if r.get('detail') else ''}")
        lines.append(f"      repro: {r.get('repro', '')}")
    lines.append("slowest cases:")
    for r in sorted(rows, key=lambda r: -(r.get("wall_s") or 0))[:10]:
        lines.append(f"  {r.get('wall_s', 0):7.2f} s  case {r['index']} {r['kind']} {r.get('label', '')} "
                     f"-> {r['outcome']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10_000, help="cases to run (indices 0..n-1)")
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--seed", type=int, default=1, help="campaign seed")
    p.add_argument("--out", type=Path, default=Path("fuzz.jsonl"), help="JSON lines, appended (resumable)")
    p.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds before a case is killed")
    p.add_argument("--mem-gib", type=float, default=4.0, help="address-space limit per worker, GiB (0: none)")
    p.add_argument("--malformed-share", type=float, default=0.2, help="share of malformed command lines")
    p.add_argument("--summary", type=Path, metavar="JSONL", help="print the summary of a campaign and exit")
    p.add_argument("--case", type=int, help="run one case in this process and print it and its outcome")
    args = p.parse_args(argv)
    if args.summary:
        print(summary(reclassify(read_results(args.summary), args.malformed_share)))
        return 0
    if args.case is not None:
        case = make_case(args.seed, args.case, args.malformed_share)
        print(json.dumps(case, indent=1))
        print(json.dumps(run_case(case, Path(tempfile.mkdtemp(prefix="simtrain-fuzz-"))), indent=1))
        return 0
    campaign(args.n, args.seed, args.out, args.workers, args.timeout, args.mem_gib, args.malformed_share)
    print(summary(read_results(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
