"""Draft-tree construction: static shapes, dynamic reranking, sibling laws."""

from __future__ import annotations

import pytest
import torch

from speculant.speculative import tree


def test_static_choices_are_closed_and_ranked():
    for depth, topk, budget in [(4, 3, 10), (5, 4, 25), (3, 2, 100), (1, 1, 1)]:
        choices = tree.static_choices(depth, topk, budget)
        assert 0 < len(choices) <= budget
        for b in range(1, len(choices) + 1):  # every prefix is a tree: parents first
            assert all(c[:-1] in choices[:b] for c in choices[:b] if len(c) > 1)
        assert tree.static_choices(depth, topk, budget // 2 + 1) == choices[: budget // 2 + 1]
        assert max(len(c) for c in choices) <= depth
        parents, ranks = tree.static_parents(choices)
        assert all(r < topk for r in ranks)
    chain = tree.static_choices(4, 1, 4)
    assert chain == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
    assert tree.static_parents(chain)[0] == [-1, 0, 1, 2]


def test_static_choices_keep_the_best_chain_first():
    choices = tree.static_choices(5, 4, 8)
    assert {(0,) * d for d in range(1, 6)} <= set(choices)


def test_rerank_keeps_the_best_in_rank_order():
    # candidates: 0,1 at depth 1; 2,3 children of 0; 4,5 children of 1; 6 child of 2
    scores = torch.tensor([[-0.1, -1.0, -0.3, -2.0, -1.1, -1.2, -0.5]])
    cand_depths = torch.tensor([[1, 1, 2, 2, 2, 2, 3]])
    cand_parents = torch.tensor([[-1, -1, 0, 0, 1, 1, 2]])
    kept = tree.rerank(scores, cand_depths, 4)
    assert kept.tolist() == [[0, 2, 6, 1]]
    assert tree.remap_parents(kept, cand_parents).tolist() == [[-1, 0, 1, -1]]
    equal = tree.rerank(torch.zeros(1, 7), cand_depths, 3)  # ties: shallower first
    assert equal.tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError, match="before it"):
        tree.static_parents([(0, 0), (0,)])


def test_top_children_add_log_probabilities():
    logprobs = torch.log_softmax(torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]]), -1)
    tokens, scores = tree.top_children(logprobs, torch.tensor([[-1.0, -2.0]]), 2)
    assert tokens.tolist() == [[[1, 2], [0, 1]]]
    assert torch.allclose(scores[0, 0, 0], -1.0 + logprobs[0, 0, 1])


def test_sibling_draft_probs_remove_earlier_siblings():
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    laws = tree.sibling_draft_probs(q, torch.tensor([[0, 2, 1]]))
    assert torch.allclose(laws[0, 0], q[0])
    assert torch.allclose(laws[0, 1], torch.tensor([0.0, 0.6, 0.4, 0.0]))
    assert torch.allclose(laws[0, 2], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    empty = tree.sibling_draft_probs(torch.tensor([[1.0, 0.0]]), torch.tensor([[0, 1]]))
    assert empty[0, 1].sum() == 0  # nothing left to draw from


def test_sampling_without_replacement_is_successive_draws():
    q = torch.tensor([0.5, 0.3, 0.15, 0.05])
    g = torch.Generator().manual_seed(0)
    draws = tree.sample_without_replacement(q.expand(20000, -1), 2, [None] * 20000, g)
    assert (draws[:, 0] != draws[:, 1]).all()
    first = torch.bincount(draws[:, 0], minlength=4).double() / 20000
    assert torch.allclose(first, q.double(), atol=0.015)
    second_given_0 = torch.bincount(draws[draws[:, 0] == 0, 1], minlength=4).double()
    assert torch.allclose(second_given_0 / second_given_0.sum(), torch.tensor([0.0, 0.6, 0.3, 0.1]).double(), atol=0.02)


def test_cut_to_depth_keeps_the_shallow_nodes_and_their_links():
    parents = [-1, -1, 0, 0, 1, 2, 4]  # depths 1, 1, 2, 2, 2, 3, 3
    assert tree.cut_to_depth(parents, 3) == (list(range(7)), parents)
    assert tree.cut_to_depth(parents, 2) == ([0, 1, 2, 3, 4], [-1, -1, 0, 0, 1])
    assert tree.cut_to_depth(parents, 1) == ([0, 1], [-1, -1])
    assert tree.cut_to_depth([-1, 0, -1, 2], 1) == ([0, 2], [-1, -1])


def test_cut_row_to_depth_rewrites_one_row_in_place():
    parents = [[-1, 0, 1], [-1, -1, 0]]
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    probs = torch.arange(18, dtype=torch.float32).view(2, 3, 3)
    tree.cut_row_to_depth(parents, tokens, probs, 0, 1)
    assert parents == [[-1], [-1, -1, 0]]
    assert tokens.tolist() == [[5, -1, -1], [8, 9, 10]]
    assert probs[0, 1:].eq(0).all() and probs[0, 0].tolist() == [0.0, 1.0, 2.0] and probs[1].equal(torch.arange(9, 18, dtype=torch.float32).view(3, 3))
    tree.cut_row_to_depth(parents, tokens, None, 1, 2)  # already shallow enough: unchanged
    assert tokens.tolist() == [[5, -1, -1], [8, 9, 10]]
