"""Reading a checkpoint folder's files: its JSON configs and its safetensors files, every
failure a `CheckpointError` naming the file. Shared by the Hugging Face and DeepSeek-V3 loaders."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from safetensors import SafetensorError, safe_open

from speculant.loader.errors import CheckpointError


def open_safetensors(path: pathlib.Path):
    """The open file (a context manager; tensors are read on demand)."""
    if not path.exists():
        raise CheckpointError(path, "no such file")
    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(path, f"corrupt safetensors file ({exc})") from None


def read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"invalid JSON ({exc})") from None
