"""The shape of a draft tree, from its parent indices alone: depths, the verify forward's
attention mask and RoPE positions, root-to-node paths, children.

Node i of a tree of n nodes has parent `parents[i]` (-1 for the root: the last verified token,
which is not a node); a parent always comes before its children. The verify forward has n + 1
rows, row 0 the root and row i + 1 node i. Construction (static choices, dynamic reranking,
sampled siblings) lives in `speculant.speculative.tree`; tree acceptance
(`speculant.sampling.tree_acceptance`), the verify step and the proposers read shapes from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def depths(parents: Sequence[int]) -> np.ndarray:  # [n] int64, 1 for the root's children
    out = np.zeros(len(parents), dtype=np.int64)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree parents must come before their children (-1 <= parents[i] < i), got parents[{i}] = {p}")
        out[i] = 1 if p < 0 else out[p] + 1
    return out


def verify_mask(parents: Sequence[int]) -> np.ndarray:  # [n + 1, n + 1] bool
    """Row 0 the root, row i + 1 node i: each row sees itself, its ancestors and the root."""
    n = len(parents)
    depths(parents)  # validates the order
    mask = np.zeros((n + 1, n + 1), dtype=bool)
    mask[:, 0] = True
    mask[0, 0] = True
    for i, p in enumerate(parents):
        mask[i + 1] = mask[p + 1]
        mask[i + 1, i + 1] = True
    return mask


def verify_positions(parents: Sequence[int], root_position: int) -> list[int]:
    """[n + 1] RoPE positions of the verify rows: the root's, then root + depth."""
    return [root_position] + (root_position + depths(parents)).tolist()


def ancestor_table(parents: Sequence[int], max_depth: int | None = None) -> np.ndarray:  # [n, D] int64
    """Row i: the root-to-node path of node i (its ancestor at depth d + 1 in column d, node i
    itself at column depth(i) - 1), -1 past its depth."""
    d = depths(parents)
    width = int(d.max(initial=0)) if max_depth is None else max_depth
    table = np.full((len(parents), width), -1, dtype=np.int64)
    for i, p in enumerate(parents):
        if p >= 0:
            table[i] = table[p]
        table[i, d[i] - 1] = i
    return table


def retrieve_paths(parents: Sequence[int]) -> np.ndarray:  # [num_leaves, D] int64
    """The root-to-leaf paths (node indices, -1 padded), leaves in node order."""
    has_child = np.zeros(len(parents), dtype=bool)
    for p in parents:
        if p >= 0:
            has_child[p] = True
    return ancestor_table(parents)[~has_child]


def children(parents: Sequence[int]) -> list[list[int]]:
    """[n + 1] children of the root (entry 0) and of each node (entry i + 1), in node order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        out[p + 1].append(i)
    return out
