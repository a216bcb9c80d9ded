"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    """smollm2-135m's real tokenizer (its full 49,152-token vocabulary), loaded once."""
    from speculant.loader import load_checkpoint

    return load_checkpoint("smollm2-135m").tokenizer
