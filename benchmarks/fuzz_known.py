"""Bugs the fuzz campaign knows about: issue 31's open ones (``KNOWN_OPEN``) and the ones it found
itself (``FOUND_BY_FUZZ``). A failure a line matches is counted as known, not new, and lets the default
suite pass; remove a line once its fix is merged. Used by ``benchmarks/fuzz_cases.py``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# -- bugs issue 31 already lists (fixed in other branches) ---------------------------------------


@dataclass(frozen=True)
class KnownBug:
    """A bug already reported in issue 31: ``matches(case, failure)`` says a failure is this bug;
    ``hangs``: it runs without bound (time or memory), so the in-process test skips its cases."""

    name: str
    matches: Callable[[dict[str, Any], str], bool]
    hangs: bool = False


def _layout(case: dict[str, Any]) -> dict[str, Any]:
    lay = case.get("config", {}).get("layout", {}) if case.get("kind") == "config" else {}
    return lay if isinstance(lay, dict) else {}


def _n_layers(case: dict[str, Any]) -> int:
    model = case.get("config", {}).get("model", {})
    return model.get("n_layers", 10**9) if isinstance(model, dict) else 10**9


def _dualpipe(case: dict[str, Any]) -> bool:
    return _layout(case).get("schedule") in ("dualpipe", "dualpipev")


def _label(case: dict[str, Any]) -> str:
    return str(case.get("label", ""))


def _huge_count_csv(case: dict[str, Any]) -> bool:
    if not _label(case).startswith("validate:"):
        return False
    text = b"".join(base64.b64decode(v) for v in case.get("files", {}).values()).decode("latin-1")
    return bool(re.search(r"\d{8,}|1e300|\binf\b", text))


KNOWN_OPEN: tuple[KnownBug, ...] = ()
"""Issue 31's open bugs, one line each; remove a line when its fix is merged."""

FOUND_BY_FUZZ: tuple[KnownBug, ...] = ()
"""Failures this campaign found that issue 31 does not list yet; let through like KNOWN_OPEN so the suite
stays green, each removed when its fix is merged. (The full-mode timeout at 32 GPUs, seed 1 case 769, is
gone: all 165 full-mode configurations of seed 1's first 2,000 cases ran in at most 0.61 CPU s on
2026-12-06.)"""


def known_bug(case: dict[str, Any], failure: str) -> str | None:
    """The name of the KNOWN_OPEN or FOUND_BY_FUZZ bug ``failure`` of ``case`` is, or None for a new one."""
    for bug in (*KNOWN_OPEN, *FOUND_BY_FUZZ):
        if bug.matches(case, failure):
            return bug.name
    return None


def known_hang(case: dict[str, Any]) -> str | None:
    """The name of a KNOWN_OPEN bug that makes ``case`` run without bound, or None."""
    for bug in (*KNOWN_OPEN, *FOUND_BY_FUZZ):
        if bug.hangs and bug.matches(case, "timeout"):
            return bug.name
    return None
