"""Facts about the code's structure (issue 27): no import cycle among simtrain's modules, and no package
importing from a later stage of the dataflow, counting the imports inside functions and under
``TYPE_CHECKING`` too (a lazy import must not hide a cycle or a backward dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import simtrain

ROOT = Path(simtrain.__file__).resolve().parent

#: The packages in the order of the dataflow (README "Project layout"): a module may import from its own
#: package and the packages before it, never from a later one. ``formats`` (users' Megatron-LM / torchtitan
#: files in and out) reads configs, clusters and schedules and serves only the command line.
STAGES = ("spec", "hardware", "plan", "lower", "cost", "engine", "studies", "validation", "formats", "cli")

#: Backward imports still allowed, each with the reason (none left: engine/critical_path's helpers moved to
#: engine/prepare.py).
ALLOWED_BACKWARD: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """A package's modules and every import between them (module level, in functions, type-only); the
    package is named ``simtrain`` (its folder may be a copy)."""
    modules = {_module_name(p, root).replace(root.name, "simtrain", 1): p for p in root.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("simtrain"):
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
                targets = [t for t in targets if t in modules][:1] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("simtrain")]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target not in (name, "simtrain") and target in modules:
                    graph.add_edge(name, target)
    return graph


def _stage(module: str) -> str | None:
    """The package of a ``simtrain.<package>...`` module (None: the top-level ``simtrain`` facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else None


def backward_imports(graph: nx.DiGraph) -> list[str]:
    """Every import from a package into a later stage (``STAGES``) that ``ALLOWED_BACKWARD`` does not list,
    as ``importer -> imported`` lines."""
    out = []
    for a, b in sorted(graph.edges()):
        sa, sb = _stage(a), _stage(b)
        if sa in STAGES and sb in STAGES and STAGES.index(sb) > STAGES.index(sa) and (a, b) not in ALLOWED_BACKWARD:
            out.append(f"{a} ({sa}) -> {b} ({sb})")
    return out


def test_packages_import_only_earlier_stages() -> None:
    """spec -> hardware -> plan -> lower -> cost -> engine -> studies -> validation -> formats -> cli."""
    offenders = backward_imports(import_graph())
    assert offenders == [], "imports from a later stage of the dataflow:\n" + "\n".join(offenders)


def test_every_package_has_a_stage() -> None:
    """A new package must be given its place in the dataflow (else its imports go unchecked)."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(STAGES)


def test_a_backward_import_is_found(tmp_path: Path) -> None:
    """A spec module importing from plan inside a function is reported; plan importing spec is not."""
    pkg = tmp_path / "simtrain"
    for sub in ("spec", "plan"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "spec" / "config.py").write_text("def names():\n    from simtrain.plan.schedules import REGISTRY\n"
                                            "    return REGISTRY\n")
    (pkg / "plan" / "schedules.py").write_text("from simtrain.spec.config import names\nREGISTRY = ()\n")
    graph = import_graph(pkg)
    assert backward_imports(graph) == ["simtrain.spec.config (spec) -> simtrain.plan.schedules (plan)"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 40 and graph.number_of_edges() > 150  # the walk found the imports
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_a_lazy_import_cycle_is_found(tmp_path: Path) -> None:
    """The walk counts an import inside a function (what hid config -> validate -> profile -> config)."""
    pkg = tmp_path / "simtrain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from simtrain.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from simtrain.a import x\n    return x\n")
    graph = import_graph(pkg)
    assert [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1] == [["simtrain.a", "simtrain.b"]]
