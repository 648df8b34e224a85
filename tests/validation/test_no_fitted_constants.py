"""The efficiency constants serve every row of a GPU type and stack: none is keyed by a run or model.

Scans the files that hold efficiency constants (software stacks, the compute cost model, the GPU and
node profiles) for any published run id and any model name (the presets and the CSV's model cells).
"""

from __future__ import annotations

import re
from pathlib import Path

from simtrain.spec.model import list_presets
from simtrain.validation.csv_cells import read_rows

ROOT = Path(__file__).resolve().parents[2]
CONSTANT_FILES = [*(ROOT / "simtrain" / f for f in ("spec/stacks.py", "spec/stack_spec.py", "lower/stack_rules.py")),
                  ROOT / "simtrain" / "cost" / "costs.py", ROOT / "simtrain" / "cost" / "host.py",
                  *sorted((ROOT / "simtrain" / "data" / "hardware_profiles").glob("**/*.yaml"))]


def _names(published: Path | None) -> set[str]:
    names = {n.lower() for n in list_presets()}
    if published is not None:
        for row in read_rows(published):
            names.add(row["run_id"].lower())
            model = (row.get("model") or "").split("(")[0].strip().lower()
            if len(model) > 3:
                names.add(model)
    return names


def _found(text: str, names: set[str]) -> list[str]:
    """The names that occur in ``text`` as whole tokens (case-insensitive)."""
    low = text.lower()
    return sorted(n for n in names if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", low))


def _hits(names: set[str]) -> list[str]:
    return [f"{path.relative_to(ROOT)}: {name!r}" for path in CONSTANT_FILES
            for name in _found(path.read_text(encoding="utf-8"), names)]


def test_no_constant_names_a_preset_model() -> None:
    assert _hits(_names(None)) == []


def test_no_constant_names_a_published_run_or_model(published_csv: Path) -> None:
    assert _hits(_names(published_csv)) == []


def test_the_scan_catches_a_fitted_constant() -> None:
    fitted = 'GEMM_EFFICIENCY = {"Llama3-70B": 0.61, "torchtitan-T4-10": 0.7}  # h100-sxm'
    assert _found(fitted, {"llama3-70b", "torchtitan-t4-10", "llama3-8b"}) == ["llama3-70b", "torchtitan-t4-10"]
