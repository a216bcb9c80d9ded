"""Tree acceptance: the greedy longest path, and multi-candidate speculative sampling that
reproduces the target's law (V = 16, exact laws known) for the first token, the next after an
accepted draft and the bonus after an accepted leaf, for siblings chosen deterministically or
drawn without replacement; removing either sibling update breaks it, and the test sees that."""

from __future__ import annotations

import pytest
import torch
from testkit import chi_square_pvalue

import speculant.sampling.tree_acceptance as tree_acceptance
from speculant import SamplingParams
from speculant.sampling.sampler import SamplingTensors, processed_probs
from speculant.sampling.tree_acceptance import accept_tree, accept_tree_greedy
from speculant.speculative import tree

ALPHA = 1e-3
VOCAB = 16
ROWS = 2500
ROUNDS = 8  # ROWS * ROUNDS samples per case

PARENTS = [-1, -1, -1, 0, 0, 2, 3]


def test_greedy_takes_the_deepest_matching_path():
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 9, 10, 11]])
    # row 0: root argmax 5 (node 0), at node 0 argmax 8 (node 3), at node 3 argmax 11 (node 6), bonus 4
    # row 1: root argmax 7 (node 2), at node 2 argmax 3 (no child 3): path [2], bonus 3
    argmax = torch.zeros(2, 8, dtype=torch.int64)
    argmax[0, [0, 1, 4, 7]] = torch.tensor([5, 8, 11, 4])
    argmax[1, [0, 3]] = torch.tensor([7, 3])
    out = accept_tree_greedy(tokens, [PARENTS, PARENTS], argmax)
    assert out.num_accepted.tolist() == [3, 1]
    assert out.path.tolist() == [[0, 3, 6], [2, -1, -1]]
    assert out.token_ids.tolist() == [[5, 8, 11, 4], [7, 3, -1, -1]]


def test_greedy_with_ragged_trees_and_nothing_accepted():
    tokens = torch.tensor([[1, 2, -1], [1, 2, 3]])
    argmax = torch.tensor([[9, 0, 0, 0], [2, 0, 3, 0]])
    out = accept_tree_greedy(tokens, [[-1, -1], [-1, -1, 1]], argmax)
    assert out.token_ids.tolist() == [[9, -1, -1], [2, 3, 0]]
    assert out.num_accepted.tolist() == [0, 2]


def test_sampling_with_one_hot_target_is_greedy():
    """Greedy requests through the sampling rule: one-hot p accepts exactly the argmax path."""
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    argmax = torch.zeros(1, 8, dtype=torch.int64)
    argmax[0, [0, 1, 4, 7]] = torch.tensor([5, 8, 11, 4])
    p = torch.nn.functional.one_hot(argmax, 16).float()
    out = accept_tree(tokens, [PARENTS], None, p)
    assert out.token_ids.tolist() == accept_tree_greedy(tokens, [PARENTS], argmax).token_ids.tolist()


# ---- the statistical test --------------------------------------------------------------------


def laws(seed: int, params: SamplingParams):
    """Target laws at the root [V], after each first token [V, V] and after each first two
    [V, V, V]; draft laws at the first two levels likewise (correlated with the target's, as a
    draft's are)."""
    g = torch.Generator().manual_seed(seed)
    target1, target2 = torch.randn(VOCAB, generator=g) * 2, torch.randn(VOCAB, VOCAB, generator=g) * 2
    draft1 = target1 + torch.randn(VOCAB, generator=g) * 1.5
    draft2 = target2 + torch.randn(VOCAB, VOCAB, generator=g) * 1.5
    target3 = torch.randn(VOCAB * VOCAB, VOCAB, generator=g) * 2
    st = lambda n: SamplingTensors.from_params([params] * n)  # noqa: E731
    return (processed_probs(target1[None], st(1))[0], processed_probs(target2, st(VOCAB)),
            processed_probs(target3, st(VOCAB * VOCAB)).view(VOCAB, VOCAB, VOCAB),
            processed_probs(draft1[None], st(1))[0], processed_probs(draft2, st(VOCAB)))


def run_trees(params: SamplingParams, siblings: int, drafts: str, seed: int = 0, q_update: bool = True):
    """ROWS * ROUNDS depth-2 trees: `siblings` children at the root, each with `siblings` children.
    drafts="sample": drawn without replacement from the draft; "top": its best tokens (one-hot q).
    Returns [N, 3] emitted tokens (-1 past the last) and the laws of x1, of x2 given x1 and of
    x3 given x1 x2 (x3 is the bonus after an accepted leaf)."""
    p1, p2, p3, q1, q2 = laws(seed, params)
    g = torch.Generator().manual_seed(seed + 100)
    parents = list([-1] * siblings) + [i for i in range(siblings) for _ in range(siblings)]
    out = []
    for _ in range(ROUNDS):
        if drafts == "top":
            first = q1.topk(siblings).indices.expand(ROWS, -1)
            second = q2[first].topk(siblings, dim=-1).indices  # [ROWS, m, m]
            q = None
        else:
            first = tree.sample_without_replacement(q1.expand(ROWS, -1), siblings, [None] * ROWS, g)
            flat_q2 = q2[first].reshape(ROWS * siblings, VOCAB)
            second = tree.sample_without_replacement(flat_q2, siblings, [None] * ROWS * siblings, g).view(ROWS, siblings, siblings)
            law1 = tree.sibling_draft_probs(q1.expand(ROWS, -1), first) if q_update else q1.expand(ROWS, siblings, -1)
            law2 = tree.sibling_draft_probs(flat_q2, second.reshape(-1, siblings)) if q_update else flat_q2[:, None].expand(-1, siblings, -1)
            q = torch.cat([law1, law2.reshape(ROWS, siblings * siblings, VOCAB)], 1)
        tokens = torch.cat([first, second.reshape(ROWS, -1)], 1)
        leaves = p3[first[:, :, None], second].reshape(ROWS, siblings * siblings, VOCAB)
        target = torch.cat([p1.expand(ROWS, 1, -1), p2[first], leaves], 1)
        result = accept_tree(tokens, [parents] * ROWS, q, target, default_generator=g)
        out.append(result.token_ids)
    return torch.cat(out), p1, p2, p3


def p_values(params, siblings, drafts, **kw) -> dict[str, float]:
    x, p1, p2, p3 = run_trees(params, siblings, drafts, **kw)
    out = {"x1": chi_square_pvalue(x[:, 0], p1)}
    second = x[:, 1] >= 0  # the first token was an accepted draft, the second the target's next
    pairs = x[second]
    expected = torch.zeros(VOCAB, VOCAB).index_add_(0, pairs[:, 0], p2[pairs[:, 0]]) / len(pairs)
    out["x2|x1"] = chi_square_pvalue(pairs[:, 0] * VOCAB + pairs[:, 1], expected.reshape(-1))
    triples = x[x[:, 2] >= 0]  # a leaf was accepted: x3 is the bonus, drawn from the target's law there
    if len(triples):  # none where top-p excludes the one leaf of a top-1 chain
        context = triples[:, 0] * VOCAB + triples[:, 1]
        expected = torch.zeros(VOCAB * VOCAB, VOCAB).index_add_(0, context, p3.view(-1, VOCAB)[context]) / len(triples)
        out["x3|x1x2"] = chi_square_pvalue(context * VOCAB + triples[:, 2], expected.reshape(-1))
    return out


T1 = SamplingParams(temperature=1.0)
T07 = SamplingParams(temperature=0.7, top_p=0.9)


@pytest.mark.parametrize("siblings", [1, 2, 4])
@pytest.mark.parametrize("drafts", ["sample", "top"])
@pytest.mark.parametrize("params", [T1, T07], ids=["t1", "t0.7-top-p"])
def test_tree_sampling_reproduces_the_target(params, siblings, drafts):
    out = p_values(params, siblings, drafts)
    assert min(out.values()) > ALPHA, out


@pytest.mark.parametrize("drafts", ["sample", "top"])
def test_without_the_sibling_residual_update_the_law_is_wrong(drafts, monkeypatch):
    monkeypatch.setattr(tree_acceptance, "sibling_residual", lambda p, q, q_token: p)
    out = p_values(T1, 3, drafts)
    assert out["x1"] < 1e-9, out


def test_without_the_without_replacement_draft_update_the_law_is_wrong():
    out = p_values(T1, 3, "sample", q_update=False)
    assert out["x1"] < 1e-9, out


def test_seeded_rows_emit_their_keyed_samples_along_the_tree():
    """A seeded row follows, depth by depth, the child holding the target's keyed sample for
    that position, and emits the keyed sample where no child holds it: its plain tokens."""
    from speculant.sampling.rng import PositionNoise

    g = torch.Generator().manual_seed(4)
    parents, vocab, rows = [-1, -1, 0, 0, 2], 6, 200
    for b in range(rows):
        noise, position = PositionNoise(b), 10 + b
        target = torch.randn(1, len(parents) + 1, vocab, generator=g).mul(2).softmax(-1)
        tokens = torch.randint(vocab, (1, len(parents)), generator=g)
        out = accept_tree(tokens, [parents], None, target, [noise], [position]).token_ids[0].tolist()
        node, expected = -1, []
        while True:
            p = target[0, node + 1]
            e = noise.exponentials([position + len(expected)], vocab, "cpu")[0]
            sample = int((p / e).argmax())
            expected.append(sample)
            kids = [c for c, parent in enumerate(parents) if parent == node and tokens[0, c] == sample]
            if not kids:
                break
            node = kids[0]
        assert out[: len(expected)] == expected and all(t == -1 for t in out[len(expected) :])
