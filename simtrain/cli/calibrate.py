"""``simtrain calibrate``: run the torch calibration suite (``calibration/``) on this machine.

simtrain itself never imports torch, so the command runs ``python -m calibration`` in a child
process with the same arguments and returns its exit status (0 done, 1 a run failed, 2 bad
arguments, 130 interrupted). ``simtrain calibrate --help`` shows the suite's options.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from collections.abc import Sequence

HELP = "measure this machine with torch microbenchmarks and write a calibrated profile"
INSTALL_HINT = ("install the calibration extra (torch, scipy, transformers): pip install 'simtrain[calibration]' "
                "(from a checkout: pip install '.[calibration]')")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``calibrate`` (its options are the suite's own; see ``main``)."""
    sub.add_parser("calibrate", help=HELP, add_help=False)


def main(argv: Sequence[str]) -> int:
    """Run ``python -m calibration ARGV``; exit status 2 when the suite, torch or scipy (the fits) is not installed."""
    missing = [m for m in ("calibration", "torch", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"simtrain calibrate: {', '.join(missing)} not importable; {INSTALL_HINT}", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "calibration", *argv])
