"""The cost model's constants stand on physics and public measurements, never on the validation rows.

Scans the Python string literals of the packages that cost a step (simtrain/cost, lower, engine, hardware)
and the values of the GPU and node profiles for anything naming a validation row (a ``run_id`` of the
visible published runs, the Megatron-Bridge archive or the hold-out -- of the hold-out only its ``run_id``
column is read, and never printed), a model preset's name, or a ``source`` of those tables; and checks that
every numeric setting of a GPU profile carries a provenance tag in its comment (``[spec]``, ``[obs]``, ...).
"""

from __future__ import annotations

import ast
import csv
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from simtrain.spec.model_presets import list_presets

ROOT = Path(__file__).resolve().parents[1]
SCANNED_PACKAGES = ("cost", "lower", "engine", "hardware")
PROFILES = ROOT / "simtrain" / "data" / "hardware_profiles"
RUN_TABLES = (Path("/work/shared/validation/published_runs.csv"),
              ROOT / "tests" / "data" / "megatron_bridge_archive_runs.csv",
              ROOT / "tests" / "data" / "holdout_runs.csv")
#: The provenance tags of the profiles' comments (README "Hardware profiles"): a datasheet figure, a
#: public measurement, a framework's source, a value derived from those, a rule of thumb, or an
#: assumption stated as one.
TAGS = re.compile(r"\[(spec|obs|src|derived|rule of thumb|assumed|unverified)[^\]]*\]")


def _column(path: Path, name: str) -> set[str]:
    """The non-empty values of one column of a CSV (read by name: no other column is kept)."""
    if not path.exists():
        return set()
    with path.open(newline="", encoding="utf-8") as fh:
        return {row[name].strip() for row in csv.DictReader(fh) if row.get(name, "").strip()}


def _forbidden() -> dict[str, set[str]]:
    run_ids: set[str] = set()
    sources: set[str] = set()
    for table in RUN_TABLES:
        run_ids |= _column(table, "run_id")
        if "holdout" not in table.name:  # of the hold-out, only the run ids are read
            sources |= _column(table, "source")
    return {"run id": {r.lower() for r in run_ids}, "source": {s.lower() for s in sources},
            "model preset": {p.lower() for p in list_presets()}}


FORBIDDEN = _forbidden()


def _names_a(kind: str, text: str) -> bool:
    """True when ``text`` names one of the forbidden ``kind`` values: preset names and run ids as whole
    tokens (between characters that cannot be part of a name), sources anywhere."""
    low = text.lower()
    for value in FORBIDDEN[kind]:
        if kind == "source":
            if value in low:
                return True
        elif re.search(rf"(?<![a-z0-9_.-]){re.escape(value)}(?![a-z0-9_-]|\.[a-z0-9])", low):
            return True
    return False


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module (module, classes, functions, and attribute docstrings)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            # the first statement, or a string right after an assignment (an attribute docstring)
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                    and (i == 0 or isinstance(body[i - 1], ast.Assign | ast.AnnAssign))):
                out.add(id(stmt.value))
    return out


def _literals() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every string literal of the scanned packages that is not a docstring."""
    for package in SCANNED_PACKAGES:
        for path in sorted((ROOT / "simtrain" / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                    yield str(path.relative_to(ROOT)), node.lineno, node.value


def _yaml_strings(value: object) -> Iterator[str]:
    """Every key and string value of a parsed YAML document."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _yaml_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _yaml_strings(v)
    elif isinstance(value, str):
        yield value


def test_the_forbidden_names_were_read() -> None:
    """The scan below is only as good as its lists: the visible runs, the archive and the presets are there."""
    assert len(FORBIDDEN["run id"]) >= 100
    assert len(FORBIDDEN["source"]) >= 10
    assert {"llama3-8b", "deepseek-v3"} <= FORBIDDEN["model preset"]


@pytest.mark.parametrize("kind", ["run id", "model preset", "source"])
def test_cost_model_literals_name_no_validation_row_model_or_source(kind: str) -> None:
    hits = [f"{f}:{line}" for f, line, text in _literals() if _names_a(kind, text)]
    assert not hits, f"string literals naming a {kind} in the cost model: {hits}"


@pytest.mark.parametrize("kind", ["run id", "model preset", "source"])
def test_hardware_profile_values_name_no_validation_row_model_or_source(kind: str) -> None:
    hits = []
    for path in sorted(PROFILES.rglob("*.yaml")):
        for text in _yaml_strings(yaml.safe_load(path.read_text(encoding="utf-8"))):
            if _names_a(kind, text):
                hits.append(str(path.relative_to(ROOT)))
    assert not hits, f"hardware profile values naming a {kind}: {hits}"


def test_every_numeric_gpu_setting_carries_a_provenance_tag() -> None:
    untagged = []
    for path in sorted((PROFILES / "gpus").glob("*.yaml")):
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        for line in path.read_text(encoding="utf-8").splitlines():
            key, sep, rest = line.partition(":")
            if not sep or line.startswith((" ", "#")) or key not in values:
                continue
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            _, _, comment = rest.partition("#")
            if not TAGS.search(comment):
                untagged.append(f"{path.name}: {key}")
    assert not untagged, f"numeric GPU profile settings without a provenance tag: {untagged}"


def test_the_scan_catches_a_planted_name() -> None:
    """The matcher finds a preset name or a run id used as a constant, not a longer word containing one."""
    preset = sorted(FORBIDDEN["model preset"])[0]
    assert _names_a("model preset", f"{preset}")
    assert _names_a("model preset", f"if name == '{preset}'")
    assert not _names_a("model preset", f"{preset}x-not-a-preset")
    run_id = sorted(_column(RUN_TABLES[1], "run_id"))[0]
    assert _names_a("run id", run_id)
