"""Draft trees as plain tensors: their construction, in two shapes, and sampled siblings.

A tree of one sequence has n nodes in rank order (most likely to be accepted first; a parent
always before its children, so the first b nodes are the tree of budget b), each a draft token with `parents[i]` the index of its parent node, -1 for the root: the last verified
token, which is not a node. The target verifies the tree in one forward over n + 1 rows, row 0
the root and row i + 1 node i; siblings share a RoPE position (`depths`), each row attends to
the cached prefix and to its own ancestors (`verify_mask`). Those shape helpers read only the
parents, and tree acceptance needs them too: they live in `speculant.sampling.tree_shape`.

Two shapes (Li et al. 2024, EAGLE and EAGLE-2):
- static: fixed child choices (`static_choices`): node (r_1, ..., r_d) is the r_d-th best child
  of node (r_1, ..., r_{d-1});
- dynamic: each level expands the `topk` frontier nodes of highest cumulative draft
  log-probability into their `topk` best children; at the end all candidates are reranked by that
  score and the best `budget` are kept (`rerank`). The cumulative score never grows along a path,
  so the kept set holds every kept node's ancestors.

Sampled drafts draw siblings without replacement from the draft's q (`sample_without_replacement`);
the i-th sibling was drawn from q with the earlier siblings removed (`sibling_draft_probs`), the
distribution the lossless tree acceptance rule must be given for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speculant.sampling.rng import row_exponentials
from speculant.sampling.tree_shape import depths

# ---- static trees ----------------------------------------------------------------------------


def static_choices(depth: int, topk: int, budget: int) -> list[tuple[int, ...]]:
    """A fixed tree: the best-child chain to `depth`, each of its nodes (and the root) with its
    `topk` best children, and each of those a best child of its own; the `budget` nodes most
    likely to be accepted (fewest non-best choices, then shallowest) kept, in that order."""
    nodes: set[tuple[int, ...]] = set()
    for d in range(depth):
        chain = (0,) * d
        for r in range(topk):
            nodes.add(chain + (r,))
            if d + 2 <= depth:
                nodes.add(chain + (r, 0))
    ranked = sorted(nodes, key=lambda c: (sum(x > 0 for x in c) + sum(c) / (10 * topk), len(c), c))
    return ranked[:budget]  # a child ranks after its parent: the kept set is closed


def static_parents(choices: Sequence[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """Parents and child ranks ([n] each) of a static tree given by its choices, parents first."""
    index = {c: i for i, c in enumerate(choices)}
    parents, ranks = [], []
    for c in choices:
        if len(c) > 1 and index.get(c[:-1], len(choices)) >= index[c]:
            raise ValueError(f"tree choice {c} lacks its parent {c[:-1]} before it")
        parents.append(index[c[:-1]] if len(c) > 1 else -1)
        ranks.append(c[-1])
    depths(parents)
    return parents, ranks


# ---- dynamic trees -----------------------------------------------------------------------------


def top_children(
    logprobs: torch.Tensor,  # [B, F, V] the draft's log-probabilities after each frontier node
    scores: torch.Tensor,  # [B, F] cumulative log-probabilities of the frontier nodes
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, F, topk] int64, scores [B, F, topk]
    values, tokens = logprobs.topk(topk, dim=-1)
    return tokens, scores[..., None] + values


def rerank(
    scores: torch.Tensor,  # [B, M] cumulative log-probabilities of every candidate
    node_depths: torch.Tensor,  # [B, M] int64
    budget: int,
) -> torch.Tensor:  # [B, budget] candidate indices, best first
    """The `budget` best candidates in rank order; ties go to the shallower, then earlier,
    candidate, so every node comes after its parent (a child's score is at most its parent's)
    and the first b of them are the best b."""
    order = torch.arange(scores.shape[1], device=scores.device)
    key = torch.stack([(-scores).double(), node_depths.double(), order.expand_as(scores).double()], -1)
    return _lexsort_rows(key)[:, :budget]


def _lexsort_rows(key: torch.Tensor) -> torch.Tensor:  # [B, M, K] -> [B, M] ascending by key[..., 0], then 1, ...
    perm = torch.arange(key.shape[1], device=key.device).expand(key.shape[0], -1)
    for k in reversed(range(key.shape[2])):
        column = key[..., k].gather(1, perm)
        perm = perm.gather(1, column.argsort(dim=1, stable=True))
    return perm


def remap_parents(
    kept: torch.Tensor,  # [B, n] kept candidate indices (parents first)
    candidate_parents: torch.Tensor,  # [B, M] int64 parent candidate index, -1 at the root
) -> torch.Tensor:  # [B, n] parent index within the kept nodes, -1 at the root
    position = torch.full_like(candidate_parents, -1)
    position.scatter_(1, kept, torch.arange(kept.shape[1], device=kept.device).expand_as(kept))
    parent = candidate_parents.gather(1, kept)
    return torch.where(parent >= 0, position.gather(1, parent.clamp(min=0)), parent)


def cut_to_depth(parents: Sequence[int], max_depth: int) -> tuple[list[int], list[int]]:
    """(kept nodes, their parents re-indexed among them): the nodes at most max_depth deep, in
    their order (a node's ancestors are shallower, so they stay)."""
    node_depths = depths(parents)
    kept = [i for i in range(len(parents)) if node_depths[i] <= max_depth]
    index = {node: j for j, node in enumerate(kept)}
    return kept, [index[parents[i]] if parents[i] >= 0 else -1 for i in kept]


def cut_row_to_depth(
    parents: list[list[int]],  # [B][n_b] each row's tree, row b replaced
    tokens: torch.Tensor,  # [B, n] int64 node tokens, -1 padded; row b rewritten in place
    probs: torch.Tensor | None,  # [B, n, V] the nodes' draft laws; row b rewritten in place
    b: int,
    max_depth: int,
) -> None:
    """Row b's tree without its nodes deeper than max_depth (nothing happens if none is)."""
    if int(depths(parents[b]).max(initial=0)) <= max_depth:
        return
    kept, parents[b] = cut_to_depth(parents[b], max_depth)
    index, pad = torch.tensor(kept, device=tokens.device), tokens.shape[1] - len(kept)
    tokens[b] = torch.cat([tokens[b].index_select(0, index), tokens.new_full((pad,), -1)])
    if probs is not None:
        probs[b] = torch.cat([probs[b].index_select(0, index), probs.new_zeros(pad, probs.shape[2])])


# ---- sampled siblings ----------------------------------------------------------------------------


def sample_without_replacement(
    probs: torch.Tensor,  # [N, V] the draft's processed q for each parent
    num: int,
    generators: Sequence[torch.Generator | None],  # [N]
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:  # [N, num] int64, in draw order
    """`num` successive draws without replacement from q (the exponential race: the order of
    q / E for E ~ Exp(1) is a Plackett-Luce, i.e. successive, draw)."""
    noise = row_exponentials(list(generators), probs.shape[-1], probs.device, default_generator)
    return (probs.float() / noise).topk(num, dim=-1).indices


def sibling_draft_probs(
    probs: torch.Tensor,  # [N, V] q of each parent
    tokens: torch.Tensor,  # [N, m] its children, in draw order
) -> torch.Tensor:  # [N, m, V] the law child i was drawn from: q without children 0..i-1, renormalized
    """All-zero where q has no mass left (a child drawn from nothing: the acceptance rule
    rejects it)."""
    num, m = tokens.shape
    removed = torch.zeros(num, m, probs.shape[-1], dtype=torch.bool, device=probs.device)
    for i in range(1, m):
        removed[:, i] = removed[:, i - 1]
        removed[:, i].scatter_(1, tokens[:, i - 1 : i], True)
    q = probs.float()[:, None, :].masked_fill(removed, 0.0)
    total = q.sum(-1, keepdim=True)
    return torch.where(total > 0, q / total.clamp(min=1e-30), torch.zeros_like(q))


__all__ = [
    "remap_parents",
    "rerank",
    "sample_without_replacement",
    "sibling_draft_probs",
    "static_choices",
    "static_parents",
    "top_children",
]
