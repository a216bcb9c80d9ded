"""Adaptive speculation length through the engine: outputs stay exactly the target's, and the
per-request k choices are counted."""

from __future__ import annotations

import argparse

import pytest
from testkit import greedy_params, tiny_hf_model, tiny_llm

from speculant.config_options import add_engine_arguments, engine_config_from_args

GREEDY = greedy_params()
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], [9, 9, 9, 9, 9, 9], list(range(100, 117)), [7, 1, 7, 1, 7, 1]]


def check_stats(stats: dict, k_max: int) -> None:
    histogram = stats["chosen_k_histogram"]
    assert histogram and all(0 <= k <= k_max for k in histogram)
    assert 0 <= stats["mean_chosen_k"] <= k_max


@pytest.mark.parametrize("batch_size", [1, 6])
def test_draft_target_greedy_equals_plain(target, plain_outputs, batch_size):
    draft = tiny_hf_model("llama", seed=5, num_hidden_layers=1)
    llm = tiny_llm(target, draft, num_draft_tokens=5, adaptive_k=True)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    check_stats(llm.stats(), 5)
    assert llm.stats()["kv_pages_used"] == 0


def test_target_as_own_draft_stays_lossless_and_speculates(target, plain_outputs):
    llm = tiny_llm(target, target, num_draft_tokens=3, adaptive_k=True)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    stats = llm.stats()
    assert stats["acceptance_rate"] == 1.0  # whatever k was chosen, every draft was right
    check_stats(stats, 3)


@pytest.mark.parametrize("batch_size", [1, 6])
def test_ngram_greedy_equals_plain(target, plain_outputs, batch_size):
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=4, adaptive_k=True)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    check_stats(llm.stats(), 4)


def test_ngram_preemption_releases_tracker_state(target, plain_outputs):
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=3, num_pages=16, adaptive_k=True)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    assert llm.stats()["preemptions"] > 0
    assert llm.engine.proposer.adaptive.tracker._counts == {}


def test_adaptive_k_is_the_default(target):
    assert tiny_llm(target, speculative="ngram").engine.proposer.adaptive is not None


def test_without_adaptive_k_every_request_gets_the_configured_k(target):
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=4, adaptive_k=False)
    llm.generate(PROMPTS[:1], GREEDY)
    assert set(llm.stats()["chosen_k_histogram"]) == {4}
    assert llm.engine.proposer.adaptive is None


def test_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--adaptive-k"])).speculative.adaptive_k is True
    assert engine_config_from_args(parser.parse_args(["--no-adaptive-k"])).speculative.adaptive_k is False


def test_the_explorer_is_drawn_among_requests_with_drafts_on_offer(monkeypatch):
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: 0)
    seen = []
    monkeypatch.setattr(adaptive.tracker, "draws", lambda rows: seen.append([z for *_, z in rows]) or [[0.5] * k for _, k, _, _ in rows])
    requests = [SimpleNamespace(request_id=str(b), num_computed_tokens=10) for b in range(4)]
    for _ in range(20):
        adaptive.choose(requests, [0, 3, 0, 3])
    assert all(z[0] == z[2] == 0.0 for z in seen)  # nothing on offer: read at the mean, never probed
    assert {b for z in seen for b in (1, 3) if z[b] != 0.0} == {1, 3}
    seen.clear()
    adaptive.choose(requests, [0, 0, 0, 0])
    assert seen == [[0.0] * 4]
