"""The helpers proposers share to make drafts."""

from __future__ import annotations

import torch

from speculant.speculative.drafts import chain_work, choose_drafts, pad_proposals


def test_greedy_drafts_are_the_argmax_without_a_distribution():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    tokens, q = choose_drafts(logits, [None, None], sampled=False, default_generator=torch.Generator())
    assert tokens.tolist() == [1, 0] and q is None


def test_a_chain_from_carried_logits_runs_a_forward_per_draft_after_the_first():
    assert chain_work([]) == (0, 0)
    assert chain_work([0, 0]) == (0, 0)
    assert chain_work([3, 1, 0]) == (2, 2)  # forwards 1 and 2 each carry the k=3 request alone


def test_proposals_pad_their_token_lists_with_minus_one():
    proposal = pad_proposals([[4, 5], [], [6]])
    assert proposal.token_ids.tolist() == [[4, 5], [-1, -1], [6, -1]]
    assert proposal.num_drafts == [2, 0, 1]
    assert pad_proposals([]).token_ids.shape == (0, 0)
