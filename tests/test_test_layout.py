"""tests/ mirrors the package without __init__ files, so pytest imports each test file by its
basename: two files of one name in different folders stop the whole collection."""

from __future__ import annotations

import collections
import pathlib


def test_test_files_have_unique_basenames():
    root = pathlib.Path(__file__).parent
    names = collections.Counter(p.name for p in root.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]
