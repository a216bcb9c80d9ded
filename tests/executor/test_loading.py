"""Loading and checking the models a proposer declares, before the executor owns them."""

from __future__ import annotations

import pytest
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.config import ModelConfig
from speculant.executor.loading import build_runner, checked_head, load_model_runner
from speculant.executor.plan import TARGET, ModelSpec
from speculant.loader.errors import CheckpointError
from speculant.loader.head_file import HeadCheckpoint, HeadFileConfig
from speculant.models.head import head_arch, init_head_weights


@pytest.fixture(scope="module")
def target():
    return build_runner(TinyCheckpoint(tiny_hf_model("llama")), ModelConfig(model="tiny"))


def test_a_draft_must_share_the_targets_vocabulary_unless_it_says_not(target):
    big = TinyCheckpoint(tiny_hf_model(vocab_size=300, num_hidden_layers=1))
    with pytest.raises(ValueError, match="must share a vocabulary"):
        load_model_runner(ModelSpec("draft", ModelConfig(model="big"), big), target.arch.vocab_size)
    runner = load_model_runner(ModelSpec("draft", ModelConfig(model="big"), big, shares_vocab=False), target.arch.vocab_size)
    assert runner.arch.vocab_size == 300


def _head(target, hidden_size: int, sha256: str) -> HeadCheckpoint:
    weights = init_head_weights(head_arch(target.arch), "normed", seed=3, std=0.1)
    return HeadCheckpoint(HeadFileConfig("normed", "tiny", sha256, hidden_size), weights)


def test_a_head_is_checked_against_its_target_and_hidden_size(target):
    hidden = target.arch.hidden_size
    spec = ModelSpec("head", ModelConfig(model="h"), _head(target, hidden, "a" * 64), head_of=TARGET)
    assert checked_head(spec, target, "a" * 64) is spec.checkpoint
    assert checked_head(spec, target, None) is spec.checkpoint  # no target to check against
    with pytest.raises(CheckpointError, match="trained for target 'tiny'"):
        checked_head(spec, target, "b" * 64)
    wide = ModelSpec("head", ModelConfig(model="h"), _head(target, hidden * 2, "a" * 64), head_of=TARGET)
    with pytest.raises(ValueError, match="hidden size"):
        checked_head(wide, target, None)
