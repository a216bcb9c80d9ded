"""Server fixtures: a tiny random Llama with SmolLM2's real tokenizer, served on 127.0.0.1.

The tokenizer, the model and the shared servers are built once per session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_helpers import (
    CONTEXT,
    RunningServer,
    engine_config,
    serve,
)
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.config import DraftModelConfig, SpeculativeConfig


@pytest.fixture(scope="session")
def smol_tokenizer():
    from speculant.loader import load_checkpoint

    return load_checkpoint("smollm2-135m").tokenizer


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_hf_model("llama", vocab_size=49152, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_model, smol_tokenizer) -> TinyCheckpoint:
    return TinyCheckpoint(tiny_model, smol_tokenizer)


@pytest.fixture(scope="session")
def server(tiny_checkpoint) -> Iterator[RunningServer]:
    with serve(tiny_checkpoint, engine_config()) as running:
        yield running


@pytest.fixture(scope="session")
def ngram_server(tiny_checkpoint) -> Iterator[RunningServer]:
    with serve(
        tiny_checkpoint, engine_config(SpeculativeConfig(method="ngram", num_draft_tokens=3, adaptive_k=False))  # drafts every step
    ) as running:
        yield running


@pytest.fixture(scope="session")
def draft_server(tiny_checkpoint, tiny_model) -> Iterator[RunningServer]:
    spec = SpeculativeConfig(method="draft", draft=DraftModelConfig(model="tiny-self"), num_draft_tokens=3, adaptive_k=False)
    with serve(
        tiny_checkpoint, engine_config(spec), draft_checkpoint=TinyCheckpoint(tiny_model)
    ) as running:
        yield running
