"""A forward's activation bytes per model family, as the memory plan counts them."""

from __future__ import annotations

import pytest
from testkit import TinyCheckpoint, arch_of, tiny_hf_model

from speculant.config import ModelConfig
from speculant.engine.activation_memory import FP32, activation_bytes, deepseek_per_token
from speculant.executor.loading import build_runner


@pytest.fixture(scope="module")
def llama():
    return tiny_hf_model("llama")


def test_only_deepseek_has_mla_and_moe_temporaries(llama):
    assert deepseek_per_token(arch_of(llama)) == 0
    assert deepseek_per_token(arch_of(tiny_hf_model("deepseek"))) > 0


def test_fp32_activations_grow_with_the_tokens_alone(llama):
    runner = build_runner(TinyCheckpoint(llama), ModelConfig(model="tiny"))
    assert activation_bytes(runner, 0) == 0
    assert activation_bytes(runner, 64) == 2 * activation_bytes(runner, 32) > 0


def test_half_precision_on_a_cpu_counts_the_widened_weight(llama):
    runner = build_runner(TinyCheckpoint(llama), ModelConfig(model="tiny", dtype="bfloat16"))
    a = runner.arch
    widest = max(a.vocab_size, 2 * a.intermediate_size)
    assert activation_bytes(runner, 0) == FP32 * widest * a.hidden_size


def test_exposed_feature_layers_add_their_outputs_and_concatenation(llama):
    runner = build_runner(TinyCheckpoint(llama), ModelConfig(model="tiny"))
    h, tokens = runner.arch.hidden_size, 32
    added = activation_bytes(runner, tokens, exposed_layers=3) - activation_bytes(runner, tokens)
    assert added == tokens * 2 * 3 * h * FP32
