"""Shared pytest set-up; the helpers themselves live in tests/testkit.py."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(params=["llama", "qwen2", "tied", "qwen3", "gemma3", "phi3"])
def tiny_kind(request) -> str:
    return request.param
