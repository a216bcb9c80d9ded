"""The cross-request n-gram store: bounded, evicts oldest first, scoped per user, and through
the n-gram proposer it raises acceptance on repeated requests without changing any output."""

from __future__ import annotations

import pytest
from testkit import tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.speculative.suffix_store import SuffixStore, continuation_length


def test_lookup_finds_the_longest_match_in_its_scope_only():
    store = SuffixStore(max_tokens=1000, min_n=1, max_n=3)
    store.add("alice", [1, 2, 3, 4, 5, 6])
    store.add("alice", [9, 3, 7, 7])
    found = store.lookup("alice", [8, 2, 3], k=2)
    assert found.match_len == 2 and found.tokens == [4, 5]  # [2, 3] beats the newer [3]
    assert store.lookup("bob", [8, 2, 3], k=2) is None
    assert store.lookup("alice", [42], k=2) is None


def test_continuation_grows_with_match_length_and_frequency():
    assert continuation_length(1, 1) == 1
    assert continuation_length(3, 1) == 3
    assert continuation_length(2, 4) == 6
    store = SuffixStore(max_tokens=1000, min_n=1, max_n=2)
    store.add("u", [5, 1, 2, 3, 4])
    assert store.lookup("u", [5], k=8).tokens == [1]  # one short match: one token
    for _ in range(3):
        store.add("u", [5, 1, 2, 3, 4])
    found = store.lookup("u", [5], k=8)
    assert found.count == 4 and found.tokens == [1, 2, 3]  # ceil(1 * (1 + log2 4))


def test_store_is_bounded_and_evicts_oldest_first():
    store = SuffixStore(max_tokens=10, min_n=1, max_n=2)
    store.add("u", [1, 2, 3, 4])
    store.add("u", [5, 6, 7, 8])
    store.add("u", [9, 10, 11, 12])  # 12 tokens > 10: the first entry goes
    assert store.num_tokens == 8 and len(store) == 2
    assert store.lookup("u", [1], k=3) is None
    assert store.lookup("u", [6], k=1).tokens == [7]
    for i in range(100):
        store.add("u", [i, i + 1, i + 2])
    assert store.num_tokens <= 10
    assert not any(key[1][0] < 97 for key in store._latest)  # evicted n-grams leave the index


def test_an_evicted_entry_keeps_newer_occurrences_indexed():
    store = SuffixStore(max_tokens=8, min_n=1, max_n=1)
    store.add("u", [1, 2, 3, 4])
    store.add("u", [1, 7, 3, 4])
    store.add("u", [0, 0])  # evicts the first entry; [1] -> 7 from the second stays
    assert store.lookup("u", [1], k=1).tokens == [7]


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
PROMPT = [5, 6, 7, 8, 9]


@pytest.mark.parametrize("store_tokens", [0, 4096])
def test_repeated_requests_draft_from_the_store_losslessly(target, store_tokens):
    plain = tiny_llm(target).generate([PROMPT], GREEDY)[0].token_ids
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=4, ngram_store_tokens=store_tokens, adaptive_k=False)
    first = llm.generate([PROMPT], GREEDY)[0]
    again = llm.generate([PROMPT], GREEDY)[0]
    assert first.token_ids == again.token_ids == plain
    if store_tokens:  # the second run finds the first one's output
        assert again.stats.tau > first.stats.tau and again.stats.acceptance_rate > 0.9
    else:
        assert again.stats.tau == first.stats.tau


def test_other_users_outputs_are_not_matched_unless_shared(target):
    for shared, expect_faster in ((False, False), (True, True)):
        llm = tiny_llm(target, speculative="ngram", num_draft_tokens=4, ngram_share_store=shared, adaptive_k=False)
        engine = llm.engine
        engine.add_request(PROMPT, GREEDY, user="alice")
        while engine.has_unfinished():
            engine.step()
        bob = engine.add_request(PROMPT, GREEDY, user="bob")
        while engine.has_unfinished():
            engine.step()
        assert (bob.spec_stats.tau > 2.5) == expect_faster, (shared, bob.spec_stats.tau)
        anonymous = engine.add_request(PROMPT, GREEDY)  # no user: no store unless shared
        while engine.has_unfinished():
            engine.step()
        assert (anonymous.spec_stats.tau > 2.5) == expect_faster
