"""Prompt lookup (`speculant.speculative.lookup`): the latest longest match's continuation, and
the incremental index that finds it as the reference scan of the whole sequence does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speculant.speculative.lookup import NgramIndex, ngram_continuation


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
