"""Prompt-lookup proposals, and their losslessness on the shared speculation framework."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.speculative.ngram import NgramIndex, ngram_continuation


def test_continuation_of_latest_longest_match():
    tokens = np.array([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3])
    assert ngram_continuation(tokens, 3, 1, 3) == [7, 8, 5]  # latest match of [1, 2, 3]
    assert ngram_continuation(tokens, 10, 1, 3) == [7, 8, 5, 1, 2, 3]
    assert ngram_continuation(np.array([4, 5, 6]), 3, 1, 3) == []
    assert ngram_continuation(tokens, 0, 1, 3) == []


@st.composite
def growing_sequences(draw):
    min_n = draw(st.integers(1, 4))
    max_n = draw(st.integers(min_n, 5))
    alphabet = draw(st.integers(1, 4))  # few symbols: many matches of every length
    chunks = draw(st.lists(st.lists(st.integers(0, alphabet), min_size=0, max_size=6), min_size=1, max_size=25))
    ks = draw(st.lists(st.integers(0, 8), min_size=len(chunks), max_size=len(chunks)))
    return min_n, max_n, chunks, ks


@settings(max_examples=400, deadline=None)
@given(growing_sequences())
def test_incremental_index_matches_the_full_scan(case):
    """Grown a chunk at a time (a prompt, then 0..k+1 tokens per step), the index proposes what
    the reference scan of the whole sequence proposes, at every step."""
    min_n, max_n, chunks, ks = case
    index, tokens = NgramIndex(min_n, max_n), []
    for chunk, k in zip(chunks, ks):
        index.extend(chunk)
        tokens += chunk
        assert index.continuation(k) == ngram_continuation(np.array(tokens, dtype=np.int64), k, min_n, max_n)


def test_indexes_survive_preemption_and_are_released():
    """A small cache preempts requests (their index is dropped and rebuilt on readmission);
    output stays the plain greedy one and no index outlives its request."""
    model = tiny_hf_model("llama")
    prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 8, 9, 8, 9], [4, 4, 4, 4, 4, 4]]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    plain = tiny_llm(model).generate(prompts, params)
    llm = tiny_llm(model, speculative="ngram", num_draft_tokens=3, num_pages=10)
    spec = llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert llm.stats()["preemptions"] > 0 and llm.stats()["draft_tokens"] > 0
    assert llm.engine.proposer._indexes == {}


def test_ngram_greedy_equals_plain():
    model = tiny_hf_model("qwen2")
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], list(range(10, 30)) * 2, [3], [8, 8, 8, 8, 8]]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    plain = tiny_llm(model).generate(prompts, params)
    llm = tiny_llm(model, speculative="ngram", num_draft_tokens=4)  # fixed k (tiny_llm); adaptive k: test_adaptive.py
    spec = llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert llm.stats()["draft_tokens"] > 0
    assert llm.stats()["kv_pages_used"] == 0


def test_speculation_near_the_context_end_and_a_full_cache():
    """k shrinks so drafts never pass the context (512) nor the whole cache."""
    model = tiny_hf_model("llama")
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    prompt = [5, 6, 7, 8] * 126 + [5]  # 505 tokens of repeats: n-gram proposes long drafts
    plain = tiny_llm(model).generate([prompt], params)[0]
    spec = tiny_llm(model, speculative="ngram", num_draft_tokens=8).generate([prompt], params)[0]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "length"
    small = [5, 6, 7] * 3
    plain = tiny_llm(model, num_pages=4).generate([small], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    spec = tiny_llm(model, num_pages=4, speculative="ngram", num_draft_tokens=4).generate(
        [small], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    )[0]
    assert spec.token_ids == plain.token_ids
