"""Start the ranks of a torch.distributed module on this machine (what torchrun does, for the CPU loop).

Each rank is a ``python -m calibration.collectives`` process with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The launcher watches them: when
one exits with an error, the others are stopped at once and the error names the failed rank with the
end of its output, so a failure never becomes a hang (the process groups also have a timeout).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.2
STOP_GRACE_S = 5.0


class RankFailed(RuntimeError):
    """A rank of the multi-process calibration failed (the message names it and its last output)."""


def free_port() -> int:
    """A free TCP port on the loopback interface for the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch_local(args: list[str], nprocs: int, threads: int, timeout_s: float, extra_env: dict[str, str] | None = None,
                 log_dir: Path | None = None, module: str = "calibration.collectives",
                 rank0_stdout: bool = True, on_poll: Callable[[], None] | None = None) -> None:
    """Run ``python -m MODULE ARGS`` as ``nprocs`` ranks on this machine and wait.

    Rank 0 prints to this process's stdout (to its log file instead when not ``rank0_stdout``); every
    rank's stderr (and the others' stdout) goes to a log file. ``threads`` pins each rank's intra-op
    threads (OMP/MKL and ``torch.set_num_threads``). ``on_poll`` is called every ``POLL_S`` while they run.

    Raises:
        RankFailed: a rank exited with an error (the others are stopped), or ``timeout_s`` passed.
    """
    port = free_port()
    logs = Path(log_dir or tempfile.mkdtemp(prefix="simtrain-calib-"))
    logs.mkdir(parents=True, exist_ok=True)
    procs, errs = [], []
    base = {**os.environ, **(extra_env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs), "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads)}
    try:
        for r in range(nprocs):
            err = logs / f"rank{r}.log"
            errs.append(err)
            env = {**base, "RANK": str(r), "LOCAL_RANK": str(r)}
            with open(err, "wb") as fh:
                out = None if r == 0 and rank0_stdout else fh
                procs.append(subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                              stdout=out, stderr=fh))
        _watch(procs, errs, timeout_s, on_poll)
    finally:
        _stop(procs)


def _watch(procs: list[subprocess.Popen[bytes]], errs: list[Path], timeout_s: float,
           on_poll: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r, c = failed[0]
            _stop(procs)
            raise RankFailed(f"rank {r} of {len(procs)} failed (exit code {c}); the other ranks were stopped. "
                             f"Its last output ({errs[r]}):\n{_tail(errs[r])}")
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            _stop(procs)
            raise RankFailed(f"the {len(procs)} ranks did not finish within {timeout_s:.0f} s and were stopped; "
                             f"logs in {errs[0].parent}")
        if on_poll is not None:
            on_poll()
        time.sleep(POLL_S)
