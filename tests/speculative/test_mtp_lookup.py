"""MTP with prompt lookup (`head_lookup`): where the sequence's last tokens occurred before, the
chain drafts what followed them instead of the head's tokens. The output stays plain decoding's
(greedy, fixed and adaptive k), a repeated request copies its earlier output from the
store as the n-gram proposer does, a lazily following head keeps only a copied step's verified rows
and so drafts as a head that followed every step, copies are priced without head forwards, and
bad settings are refused by name. (Sampling: test_mtp_sampling.)"""

from __future__ import annotations

import itertools

import pytest
from testkit import (
    MIXED_PROMPTS,
    greedy_params,
    record_drafts_and_head_rows,
    record_offer_kinds,
    tiny_llm,
)

from speculant.speculative import mtp
from speculant.speculative.adaptive import AdaptiveK

GREEDY = greedy_params()
PROMPTS = MIXED_PROMPTS + [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [20, 21, 22, 20, 21, 22, 20]]  # repeats to copy


def copied(kinds: list) -> int:
    """Offers that were copies (`record_offer_kinds`)."""
    return sum(kind is not None for kind in kinds)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("batch_size", [1, len(PROMPTS)])
def test_mtp_with_lookup_equals_plain(target, head, plain_outputs, k, batch_size, monkeypatch):
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=k, adaptive_k=False, head_lookup=2)
    kinds = record_offer_kinds(llm.engine.proposer, monkeypatch)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    assert copied(kinds) > 0
    assert llm.stats()["kv_pages_used"] == 0


def test_adaptive_mtp_with_lookup_equals_plain(target, head, plain_outputs, monkeypatch):
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=3, adaptive_k=True, head_lookup=1)
    kinds = record_offer_kinds(llm.engine.proposer, monkeypatch)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    assert copied(kinds) > 0


@pytest.mark.parametrize("store_tokens", [0, 4096])
def test_a_repeated_request_copies_its_earlier_output_from_the_store(target, head, store_tokens):
    prompt = [5, 6, 7, 8, 9]
    plain = tiny_llm(target).generate([prompt], GREEDY)[0].token_ids
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=4, adaptive_k=False, ngram_store_tokens=store_tokens)
    first, again = (llm.generate([prompt], GREEDY)[0] for _ in range(2))
    assert first.token_ids == again.token_ids == plain
    assert (again.stats.tau > first.stats.tau) == bool(store_tokens)  # the first output, copied from the store


def run_pattern(target, head, monkeypatch, lazy: bool):
    """Every third decode step every request drafts (k 3: copies where a match offers, else the
    head's chain); (outputs, drafts, copied steps, head rows run)."""
    steps = itertools.count()

    def choose(self, requests, k_max, keys=None, backlog=None):
        return [0 if next(steps) % 3 else k for k in k_max]

    monkeypatch.setattr(AdaptiveK, "choose", choose)
    monkeypatch.setattr(mtp.MtpProposer, "LAZY_FEED", lazy)
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=3, adaptive_k=True, head_lookup=2)
    kinds = record_offer_kinds(llm.engine.proposer, monkeypatch)
    drafts, rows = record_drafts_and_head_rows(llm, monkeypatch, mtp.HEAD)
    outs = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    return outs, drafts, copied(kinds), sum(rows)


def test_a_lazy_head_keeps_a_copied_step_s_verified_rows_and_drafts_as_a_following_one(target, head, plain_outputs, monkeypatch):
    outs, drafts, copies, rows = run_pattern(target, head, monkeypatch, lazy=True)
    assert outs == plain_outputs and copies > 0
    following = run_pattern(target, head, monkeypatch, lazy=False)
    assert following[:3] == (outs, drafts, copies)  # the backlogs left the head where following it would
    assert rows < following[3]  # the rejected copies' rows were never run


def test_copies_are_priced_without_head_forwards(target, head):
    proposer = tiny_llm(target, speculative="mtp", draft_checkpoint=head, head_lookup=2, adaptive_k=True).engine.proposer
    proposer._planned, proposer._copies = ["a", "b", "c"], {"b": [1, 2, 3]}
    assert proposer.draft_work([3, 3, 0]) == (2, 2)  # a's chain alone: forwards 2, rows 2
    assert proposer.fed_requests([3, 3, 0]) == 1  # the head follows a; b copied, c plain
    proposer._copies = {}
    assert proposer.draft_work([3, 3, 0]) == (2, 4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"head_lookup": 5}, "ngram_max_n"),
        ({"head_lookup": 3, "ngram_max_n": 2}, "ngram_max_n"),
        ({"head_lookup": -1}, "head_lookup must be >= 0"),
    ],
)
def test_bad_lookup_settings_are_refused_by_name(target, head, options, message):
    with pytest.raises(ValueError, match=message):
        tiny_llm(target, speculative="mtp", draft_checkpoint=head, **options)


def test_copies_by_default_in_chains_and_never_in_trees(target, head):
    assert tiny_llm(target, speculative="mtp", draft_checkpoint=head).engine.proposer.lookup.min_n == 3
    assert tiny_llm(target, speculative="mtp", draft_checkpoint=head, head_lookup=0).engine.proposer.lookup is None
    tree = tiny_llm(target, speculative="eagle", draft_checkpoint=head, ngram_max_n=2).engine.proposer
    assert tree.lookup is None  # the default head_lookup is no error where nothing copies
