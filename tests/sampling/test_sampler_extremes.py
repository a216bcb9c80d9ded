"""Sampling at the edges of its parameters: tiny temperatures, vanishing top-p, min-p at 1."""

from __future__ import annotations

import pytest
import torch

from speculant.sampling.params import GREEDY_BELOW, INT64_MAX, SamplingParams
from speculant.sampling.sampler import (
    SamplingTensors,
    processed_probs,
    sample_logits,
    top_token_logprobs,
)


def _logits(rows: int = 4, vocab: int = 50) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 5


def _one_hot_at_argmax(probs: torch.Tensor, logits: torch.Tensor) -> bool:
    return bool(torch.isfinite(probs).all()) and torch.equal(probs.argmax(-1), logits.argmax(-1)) and bool(
        torch.allclose(probs.amax(-1), torch.ones(len(probs)))
    )


@pytest.mark.parametrize("temperature", [1e-38, 1e-37, 1e-20, GREEDY_BELOW / 2, 5e-324])
def test_a_temperature_below_the_threshold_is_greedy(temperature):
    params = SamplingParams(temperature=temperature)
    assert params.greedy
    logits = _logits()
    st = SamplingTensors.from_params([params] * len(logits))
    assert torch.equal(sample_logits(logits, st), logits.argmax(-1))
    assert _one_hot_at_argmax(processed_probs(logits, st), logits)


@pytest.mark.parametrize("temperature", [1e-38, 1e-30, 1e-6])
def test_processed_probs_stay_a_distribution_for_tiny_temperatures_not_flagged_greedy(temperature):
    logits = _logits()
    n = len(logits)
    st = SamplingTensors(
        temperature=torch.full((n,), temperature),
        top_k=torch.zeros(n, dtype=torch.int64),
        top_p=torch.ones(n),
        min_p=torch.zeros(n),
        greedy=torch.zeros(n, dtype=torch.bool),
    )
    probs = processed_probs(logits, st)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(n))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 1e-45, 1e-9])
def test_a_vanishing_top_p_keeps_the_top_token(top_p):
    logits = _logits()
    st = SamplingTensors.from_params([SamplingParams(temperature=1.0, top_p=top_p)] * len(logits))
    probs = processed_probs(logits, st)
    assert _one_hot_at_argmax(probs, logits)
    tokens = sample_logits(logits, st, default_generator=torch.Generator().manual_seed(1))
    assert torch.equal(tokens, logits.argmax(-1))


def test_min_p_of_one_keeps_the_top_token_even_when_probabilities_tie():
    logits = torch.zeros(2, 8)  # every token ties: the max itself must stay
    logits[1, 3] = 1.0
    st = SamplingTensors.from_params([SamplingParams(temperature=1.0, min_p=1.0)] * 2)
    probs = processed_probs(logits, st)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2))
    assert probs[1, 3] == 1.0


def test_top_k_at_the_int64_limit_is_no_cut():
    logits = _logits()
    st = SamplingTensors.from_params([SamplingParams(temperature=1.0, top_k=INT64_MAX)] * len(logits))
    expected = SamplingTensors.from_params([SamplingParams(temperature=1.0)] * len(logits))
    assert torch.allclose(processed_probs(logits, st), processed_probs(logits, expected))


@pytest.mark.parametrize(
    "field, value",
    [
        ("top_k", INT64_MAX + 1),
        ("max_tokens", 2**64),
        ("seed", 2**64),
        ("num_draft_tokens", 2**70),
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("top_p", float("nan")),
        ("min_p", float("nan")),
        ("temperature", "1"),
        ("top_k", True),
        ("stop_token_ids", (2**63,)),
    ],
)
def test_values_no_tensor_can_hold_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**{field: value})


def test_the_largest_values_that_fit_build_tensors():
    params = SamplingParams(max_tokens=INT64_MAX, top_k=INT64_MAX, seed=2**64 - 1, temperature=1e300)
    st = SamplingTensors.from_params([params])
    assert st.top_k.item() == INT64_MAX
    torch.Generator().manual_seed(params.seed)


def test_top_token_logprobs_are_the_best_tokens_most_likely_first():
    logits = _logits(3, 40)
    values, ids = top_token_logprobs(logits, 5)
    full = logits.log_softmax(-1)
    assert ids.shape == values.shape == (3, 5)
    assert torch.equal(ids[:, 0], logits.argmax(-1))
    assert torch.allclose(values, full.gather(-1, ids))
    assert (values[:, :-1] >= values[:, 1:]).all()
    assert (full.sort(-1, descending=True).values[:, 5] <= values[:, -1]).all()
