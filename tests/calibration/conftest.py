"""Fixtures of the calibration tests; ``timing`` tests need the machine to themselves.

A ``timing`` test compares wall-clock measurements (the CPU loop). Under pytest-xdist another worker
runs other tests on the same cores at the same time, which would distort both the calibration and
the measured step, so those tests skip inside an xdist worker; ``.ci/run`` runs them on their own:
``pytest -q -m timing -p no:xdist tests/calibration``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    skip = pytest.mark.skip(reason="timing test: needs the machine to itself; run "
                                   "`pytest -q -m timing -p no:xdist tests/calibration` (.ci/run does)")
    for item in items:
        if "timing" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def profiles_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user profile folder with an empty ``calibrated/`` (SIMTRAIN_PROFILES_DIR); the built-in GPU
    and node profiles stay visible beside it."""
    root = tmp_path / "profiles"
    (root / "calibrated").mkdir(parents=True)
    monkeypatch.setenv("SIMTRAIN_PROFILES_DIR", str(root))
    return root
