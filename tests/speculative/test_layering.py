"""The speculative package sits below the engine: it imports nothing from `speculant.engine`."""

from __future__ import annotations

import ast
from pathlib import Path

import speculant.speculative

PACKAGE = Path(speculant.speculative.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (TYPE_CHECKING blocks and functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            names.add(node.module or "")
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_speculative_imports_nothing_from_engine():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) >= 4
    for path in files:
        engine = {m for m in imported_modules(path) if m == "speculant.engine" or m.startswith("speculant.engine.")}
        assert not engine, f"{path.relative_to(PACKAGE.parent)} imports {sorted(engine)}"


def test_the_scan_sees_engine_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("if True:\n    from speculant.engine.engine import Engine\nimport speculant.engine\n")
    assert {"speculant.engine.engine", "speculant.engine"} <= imported_modules(probe)
