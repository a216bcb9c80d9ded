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

from speculant.sampling.rng import PositionNoise, sample_from_weights
from speculant.sampling.tree_shape import ancestor_table, children


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
    """Walk each tree from the root (see the module docstring). Unseeded rows draw one uniform
    per tried child, then V exponentials for the final token, from the default generator. A
    seeded row (as in `speculant.sampling.acceptance`) takes at each depth the target's keyed
    sample argmax(p / E) for that position and follows the child holding it, if any: exactly
    its plain-decoding tokens, whatever the tree."""
    num_rows, n = token_ids.shape
    paths, finals, keyed = [], [], {}
    for b in range(num_rows):
        if noise is not None and noise[b] is not None:
            path, keyed[b] = _walk_keyed(token_ids[b], parents[b], target_probs[b], noise[b], positions[b])
            p = target_probs[b, 0].float()
        else:
            q = None if draft_probs is None else draft_probs[b]
            path, p = _walk(token_ids[b], parents[b], q, target_probs[b], None, default_generator)
        paths.append(path)
        finals.append(p)
    final = sample_from_weights(torch.stack(finals), None, default_generator)
    for b, token in keyed.items():
        final[b] = token
    width = max((_depth_max(p) for p in parents if len(p)), default=0)
    path = torch.tensor(_padded([np.asarray(x, dtype=np.int64) for x in paths], width, -1), device=token_ids.device)
    num_accepted = torch.tensor([len(x) for x in paths], dtype=torch.int64, device=token_ids.device)
    return TreeAcceptResult(_emitted(token_ids, path, num_accepted, final), path, num_accepted)


def _walk_keyed(tokens, parents, target_probs, noise: PositionNoise, position: int) -> tuple[list[int], int]:
    """A seeded tree: (accepted node indices, the keyed sample after them)."""
    kids = children(parents)
    tokens_host = tokens.tolist()
    node, path = -1, []
    while True:
        p = target_probs[node + 1].float()
        e = noise.exponentials([position + len(path)], p.shape[-1], p.device)[0]
        sample = int((p / e).argmax())
        match = [c for c in kids[node + 1] if tokens_host[c] == sample]
        if not match:
            return path, sample
        node = match[0]
        path.append(node)


def _walk(tokens, parents, q, target_probs, generator, default_generator) -> tuple[list[int], torch.Tensor]:
    """One tree: the accepted node indices and the law of the token after them."""
    kids = children(parents)
    tokens_host = tokens.tolist()
    node, path, p = -1, [], target_probs[0].float()
    while True:
        for c in kids[node + 1]:
            token = tokens_host[c]
            q_c = None if q is None else q[c].float()
            q_token = 1.0 if q_c is None else float(q_c[token])
            g = generator if generator is not None else default_generator
            u = torch.rand(1, generator=g, device=g.device if g is not None else None).item()
            if q_token > 0 and u * q_token < float(p[token]):
                node = c
                path.append(c)
                p = target_probs[c + 1].float()
                break
            p = sibling_residual(p, q_c if q_c is not None else _one_hot(token, p), q_token)
        else:
            return path, p


def sibling_residual(p: torch.Tensor, q: torch.Tensor, q_token: float) -> torch.Tensor:
    """[V] the target law for the next sibling after one is rejected: normalize(max(0, p - q)).
    p itself where q is empty (nothing was drawn) or the residual has no mass (rounding only)."""
    if q_token <= 0:
        return p
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    out[token] = 1.0
    return out


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
