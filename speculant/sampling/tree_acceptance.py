"""Tree verification: the longest acceptable root-to-leaf path, and the target's token after it.

Greedy (`accept_tree_greedy`): the deepest node whose every token on its path equals the target's
argmax at its parent; the bonus token is the argmax at that node.

Sampling (`accept_tree`): multi-candidate speculative sampling (Miao et al. 2024, SpecInfer;
Li et al. 2024, EAGLE), walked from the root. At a node with target law p, its children are
tried in order: child c, drawn from q_c, is accepted with probability min(1, p(c) / q_c(c)) and
the walk moves to it; on rejection p <- normalize(max(0, p - q_c)) (`sibling_residual`) and the
next sibling is tried. When every child is rejected the recovered token is drawn from the last p;
when the walk reaches a leaf the bonus token is drawn from the target's law there. Emitted tokens
are then distributed exactly as the target's own samples, provided q_c is the law child c was
really drawn from: one-hot at c for drafts chosen deterministically (top-k children), and for
siblings sampled without replacement the parent's q with the earlier siblings removed
(`speculant.speculative.tree.sibling_draft_probs`). A child with q_c(c) = 0 is always rejected
and leaves p unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from speculant.sampling.rng import PositionNoise, row_uniforms, sample_from_weights
from speculant.sampling.tree_shape import ancestor_table, depths


@dataclass
class TreeAcceptResult:
    token_ids: torch.Tensor  # [B, D + 1] int64 the accepted path's tokens, then the recovered/bonus token; -1 padded
    path: torch.Tensor  # [B, D] int64 node indices of the accepted path, root to tip; -1 padded
    num_accepted: torch.Tensor  # [B] int64 path length (accepted drafts)

    @property
    def num_emitted(self) -> torch.Tensor:  # [B]
        return self.num_accepted + 1


def accept_tree_greedy(
    token_ids: torch.Tensor,  # [B, n] int64 draft tokens, -1 past each tree's nodes
    parents: Sequence[Sequence[int]],  # [B][n_b] breadth-first parents, -1 at the root
    target_argmax: torch.Tensor,  # [B, n + 1] int64 the target's argmax at the root (0) and node i (i + 1)
) -> TreeAcceptResult:
    """Vectorized over the batch; no host read (the trees' shapes are host data already)."""
    num_rows, n = token_ids.shape
    device = token_ids.device
    parent_rows = torch.from_numpy(_padded([np.asarray(p) + 1 for p in parents], n, 0)).to(device)  # [B, n]
    matched = torch.zeros(num_rows, n + 1, dtype=torch.bool, device=device)
    matched[:, 0] = True
    fits = token_ids == target_argmax.gather(1, parent_rows)  # [B, n]
    for i in range(n):
        matched[:, i + 1] = fits[:, i] & matched.gather(1, parent_rows[:, i : i + 1])[:, 0]
    return _deepest_path(token_ids, parents, matched[:, 1:], target_argmax)


def _deepest_path(token_ids, parents, matched, target_argmax) -> TreeAcceptResult:
    num_rows, n = token_ids.shape
    device = token_ids.device
    width = max((int(len(p) and _depth_max(p)) for p in parents), default=0)
    tables = torch.from_numpy(np.stack([_padded_table(p, n, width) for p in parents])).to(device)  # [B, n, D]
    node_depths = (tables >= 0).sum(-1)  # [B, n]
    reach = torch.where(matched, node_depths, 0)
    num_accepted, best = reach.max(dim=1)  # the first deepest matched node
    path = tables[torch.arange(num_rows, device=device), best]  # [B, D]
    column = torch.arange(width, device=device)
    path = torch.where(column < num_accepted[:, None], path, -1)
    tip_row = torch.where(num_accepted > 0, best + 1, 0)
    bonus = target_argmax.gather(1, tip_row[:, None])[:, 0]
    return TreeAcceptResult(_emitted(token_ids, path, num_accepted, bonus), path, num_accepted)


def accept_tree(
    token_ids: torch.Tensor,  # [B, n] int64, -1 past each tree's nodes
    parents: Sequence[Sequence[int]],  # [B][n_b]
    draft_probs: torch.Tensor | None,  # [B, n, V] q_c, the law node c was drawn from; None: one-hot at the token
    target_probs: torch.Tensor,  # [B, n + 1, V] processed target laws at the root (0) and node i (i + 1)
    noise: Sequence[PositionNoise | None] | None = None,  # [B] seeded rows' noise; None: unseeded
    positions: Sequence[int] | None = None,  # [B] sequence position of each root's children
    default_generator: torch.Generator | None = None,
) -> TreeAcceptResult:
    """Walk every tree from the root (see the module docstring), all rows at once, on the device:
    no host read. Nodes are taken in order (parents before children, siblings in node order): a
    row tries node c when its walk stands at c's parent. Unseeded rows draw one uniform per node
    up front (a node is tried at most once) and V exponentials for the final token, from the
    default generator. A seeded row (as in `speculant.sampling.acceptance`) takes at each depth
    the target's keyed sample argmax(p / E) for that position and follows the child holding it,
    if any: exactly its plain-decoding tokens, whatever the tree."""
    num_rows, n = token_ids.shape
    device = token_ids.device
    parent = torch.from_numpy(_padded([np.asarray(p) for p in parents], n, -2)).to(device)  # [B, n] -2 past the tree
    seeded = torch.tensor([noise is not None and noise[b] is not None for b in range(num_rows)], dtype=torch.bool, device=device)
    keyed = _keyed_samples(parents, target_probs, noise, positions)  # [B, n + 1]
    uniforms = row_uniforms([None] * num_rows, n, device, default_generator)  # [B, n]
    node = torch.full((num_rows,), -1, dtype=torch.int64, device=device)  # where each walk stands (-1: the root)
    p = target_probs[:, 0].float()  # [B, V] the law the next tried child is judged by
    for c in range(n):
        tried = parent[:, c] == node
        token = token_ids[:, c].clamp(min=0)
        q = _one_hot(token, p) if draft_probs is None else draft_probs[:, c].float()  # [B, V]
        q_token = q.gather(1, token[:, None])[:, 0]
        drawn = (q_token > 0) & (uniforms[:, c] * q_token < p.gather(1, token[:, None])[:, 0])
        accept = tried & torch.where(seeded, token == keyed.gather(1, node[:, None] + 1)[:, 0], drawn)
        p = sibling_residual(p, q, torch.where(tried & ~accept & ~seeded, q_token, 0.0))  # p where nothing was rejected
        p = torch.where(accept[:, None], target_probs[:, c + 1].float(), p)
        node = torch.where(accept, c, node)
    final = torch.where(seeded, keyed.gather(1, node[:, None] + 1)[:, 0], sample_from_weights(p, None, default_generator))
    width = max((_depth_max(tree) for tree in parents if len(tree)), default=0)
    paths = np.full((num_rows, n + 1, width), -1, dtype=np.int64)  # row 0 the root's (empty) path, row i + 1 node i's
    for b, tree in enumerate(parents):
        paths[b, 1:] = _padded_table(tree, n, width)
    path = torch.from_numpy(paths).to(device)[torch.arange(num_rows, device=device), node + 1]  # [B, D]
    num_accepted = (path >= 0).sum(1)
    return TreeAcceptResult(_emitted(token_ids, path, num_accepted, final), path, num_accepted)


def _keyed_samples(parents, target_probs, noise, positions) -> torch.Tensor:  # [B, n + 1] int64
    """Each seeded row's keyed sample at the root (0) and at node i (i + 1), drawn with the noise
    of the position that node's child would take; -1 in unseeded rows."""
    num_rows, rows_per_tree, vocab = target_probs.shape
    out = torch.full((num_rows, rows_per_tree), -1, dtype=torch.int64, device=target_probs.device)
    for b in range(num_rows):
        if noise is None or noise[b] is None:
            continue
        depth = np.zeros(rows_per_tree, dtype=np.int64)
        depth[1 : len(parents[b]) + 1] = depths(parents[b])
        exponentials = noise[b].exponentials([positions[b] + d for d in range(int(depth.max()) + 1)], vocab, target_probs.device)
        picked = exponentials.index_select(0, torch.from_numpy(depth).to(target_probs.device))  # [n + 1, V]
        out[b] = (target_probs[b].float() / picked).argmax(-1)
    return out


def sibling_residual(
    p: torch.Tensor,  # [B, V] the law the rejected sibling was judged by
    q: torch.Tensor,  # [B, V] the law it was drawn from
    q_token: torch.Tensor,  # [B] q at its token
) -> torch.Tensor:  # [B, V]
    """The target law for the next sibling after one is rejected: normalize(max(0, p - q)).
    p itself where q is empty (nothing was drawn) or the residual has no mass (rounding only)."""
    residual = (p - q).clamp_(min=0)
    total = residual.sum(-1, keepdim=True)
    keep = (q_token[:, None] <= 0) | (total <= 0)
    return torch.where(keep, p, residual.div_(torch.where(keep, 1.0, total)))


def _one_hot(token: torch.Tensor, like: torch.Tensor) -> torch.Tensor:  # [B] -> [B, V] like `like`
    return torch.zeros_like(like).scatter_(1, token[:, None], 1.0)


def _emitted(token_ids, path, num_accepted, final) -> torch.Tensor:  # [B, D + 1]
    width = path.shape[1]
    accepted = torch.where(path >= 0, token_ids.gather(1, path.clamp(min=0)), -1) if width else path
    out = torch.cat([accepted, torch.full_like(num_accepted[:, None], -1)], 1)
    return out.scatter_(1, num_accepted[:, None], final[:, None])


def _depth_max(parents: Sequence[int]) -> int:
    table = ancestor_table(parents)
    return table.shape[1]


def _padded_table(parents: Sequence[int], n: int, width: int) -> np.ndarray:  # [n, width]
    out = np.full((n, width), -1, dtype=np.int64)
    if len(parents):
        out[: len(parents)] = ancestor_table(parents, width)
    return out


def _padded(rows: list[np.ndarray], width: int, fill: int) -> np.ndarray:  # [B, width]
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out


__all__ = ["TreeAcceptResult", "accept_tree", "accept_tree_greedy", "sibling_residual"]
