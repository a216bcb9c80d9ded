"""Bench fixtures: a tiny random Llama with SmolLM2's real tokenizer (chat template included)."""

from __future__ import annotations

import pytest
from testkit import TinyCheckpoint, tiny_hf_model


@pytest.fixture(scope="session")
def smol_tokenizer():
    from speculant.loader import load_checkpoint

    return load_checkpoint("smollm2-135m").tokenizer


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_hf_model("llama", vocab_size=49152, max_position_embeddings=1024)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_model, smol_tokenizer) -> TinyCheckpoint:
    return TinyCheckpoint(tiny_model, smol_tokenizer)
