"""A JSON file of measurements under `$SPECULANT_CACHE`, read whole and replaced atomically."""

from __future__ import annotations

import json
import os
import pathlib


def read_json(path: pathlib.Path) -> dict:
    """The file's object, or {} when it is missing or unreadable (a cache is never required)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: pathlib.Path, data: dict) -> None:
    """Replace the file atomically; a read-only cache only costs a re-measurement next start."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass
