"""Shared pytest set-up; the helpers themselves live in tests/testkit.py."""

from __future__ import annotations

import os

# isort: off
import speculant  # noqa: F401  # first: it sets OpenMP's wait policy before torch loads (`speculant/utils/threads.py`)
import pytest
import torch
# isort: on

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(params=["llama", "qwen2", "tied", "qwen3", "gemma3", "phi3"])
def tiny_kind(request) -> str:
    return request.param
