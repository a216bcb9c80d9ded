"""The import contract in pyproject.toml ([tool.importlinter]): speculant's layers, from `utils`
and `config` up to `cli`; a module imports only from its own layer or those below it, imports
inside functions included. import-linter checks it; a copy of the package with one upward
import added breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import speculant

ROOT = Path(speculant.__file__).parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repository's contract, on the `speculant` package under `package_parent`."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=package_parent, env=env, capture_output=True, text=True, timeout=300,
    )


def test_the_import_contract_is_kept():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


def test_an_upward_import_inside_a_function_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "speculant", tmp_path / "speculant", ignore=shutil.ignore_patterns("__pycache__", "heads", "csrc"))
    low = tmp_path / "speculant" / "sampling" / "params.py"
    low.write_text(low.read_text() + "\n\ndef _engine():\n    from speculant.engine.engine import Engine\n\n    return Engine\n")
    run = lint_imports(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "speculant.sampling.params -> speculant.engine.engine" in run.stdout
