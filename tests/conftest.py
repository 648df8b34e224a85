"""Suite-wide setup: the tests never see the developer's own hardware profiles.

``$SIMTRAIN_PROFILES_DIR`` points at an empty temporary folder for the whole session (its
subprocesses inherit it), so a profile in ``~/.local/share/simtrain/profiles`` can neither change a
result nor make a built-in name ambiguous, and a test that calibrates writes nowhere but there.
Tests that need their own user profiles set the variable again with ``monkeypatch``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_ENV = "SIMTRAIN_PROFILES_DIR"
_saved: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    _saved["env"] = os.environ.get(_ENV)
    _saved["dir"] = tempfile.mkdtemp(prefix="simtrain-test-profiles-")
    os.environ[_ENV] = _saved["dir"]


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = _saved.pop("dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    old = _saved.pop("env", None)
    if old is None:
        os.environ.pop(_ENV, None)
    else:
        os.environ[_ENV] = old
