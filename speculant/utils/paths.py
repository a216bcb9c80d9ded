"""Where speculant keeps what it fetches, measures and builds on this machine."""

from __future__ import annotations

import os
import pathlib


def cache_dir() -> pathlib.Path:
    """`$SPECULANT_CACHE`, default `~/.cache/speculant`: models, kernel choices, native builds."""
    root = os.environ.get("SPECULANT_CACHE")
    return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "speculant"
