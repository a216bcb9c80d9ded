"""Every import in the package, read from the source (those inside functions and TYPE_CHECKING
blocks included): no two modules import each other, directly or around a circle, and every import
points down the layers of pyproject.toml's import contract (see test_layers.py)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import speculant

PACKAGE = Path(speculant.__file__).parent
ROOT = PACKAGE.parent


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, package: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(imported package module, line) for every import statement of the file, at any depth; a
    name imported from a module is the module, a submodule imported from a package the submodule."""
    here = module_name(path, package)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, up level - 1
                package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:  # speculant.x.name -> speculant.x
                target = target.rsplit(".", 1)[0]
            if target in modules and target != here:
                found.append((target, node.lineno))
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}."""
    files = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        graph[name] = {}
        for target, line in imports_of(path, package, set(files)):
            graph[name].setdefault(target, line)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, {}):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_rank() -> dict[str, tuple[int, int]]:
    """Top-level module name -> (its layer's rank from the bottom, the index of its group among
    independent siblings: 0 for a layer of one), from pyproject.toml's contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    ranks = {}
    for rank, layer in enumerate(reversed(contract["layers"])):
        for sibling, name in enumerate(part.strip() for part in layer.split("|")):
            ranks[name] = (rank, sibling)
    return ranks


def upward_imports(graph: dict[str, dict[str, int]], ranks: dict[str, tuple[int, int]]) -> list[str]:
    """Imports that point up a layer or across to an independent sibling; the package's root
    module re-exports from the top and may not be imported from inside the package."""
    top = (len(ranks), 0)
    bad = []
    for importer, targets in graph.items():
        if importer == "speculant":
            continue
        low = ranks.get(importer.split(".")[1], top)
        for target, line in targets.items():
            high = (len(ranks) + 1, 0) if target == "speculant" else ranks.get(target.split(".")[1], top)
            if high[0] > low[0] or (high[0] == low[0] and high[1] != low[1]):
                bad.append(f"{importer}:{line} imports {target}")
    return bad


def test_no_module_imports_itself_around_a_circle():
    graph = import_graph()
    assert len(graph) > 100 and "speculant.engine.engine" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_every_import_points_down_the_layers():
    graph = import_graph()
    ranks = layer_rank()
    assert {m.split(".")[1] for m in graph if m.count(".") >= 1} <= set(ranks), "a package the contract does not place"
    assert upward_imports(graph, ranks) == []


def test_the_scan_sees_imports_inside_functions(tmp_path):
    package = tmp_path / "speculant"
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    for path in ("__init__.py", "low/__init__.py", "high/__init__.py"):
        (package / path).write_text("")
    (package / "high" / "top.py").write_text("from speculant.low import base\n")
    (package / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import speculant.low\n\n"
        "def build():\n    from speculant.high.top import thing\n"
    )
    graph = import_graph(package)
    assert graph["speculant.low.base"] == {"speculant.low": 3, "speculant.high.top": 6}
    assert find_cycle(graph) == ["speculant.high.top", "speculant.low.base", "speculant.high.top"]
    ranks = {"low": (0, 0), "high": (1, 0)}
    assert upward_imports(graph, ranks) == ["speculant.low.base:6 imports speculant.high.top"]
