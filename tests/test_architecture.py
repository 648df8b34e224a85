"""Facts about the code's structure (issue 27): no import cycle among simtrain's modules, counting the
imports inside functions and under ``TYPE_CHECKING`` too (a lazy import must not hide a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import simtrain

ROOT = Path(simtrain.__file__).resolve().parent


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
