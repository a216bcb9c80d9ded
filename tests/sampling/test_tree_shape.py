"""A tree's shape from its parents: depths, verify positions and mask, paths, children."""

from __future__ import annotations

import numpy as np
import pytest
from testkit import ancestor_mask

from speculant.sampling import tree_shape

#        root
#       /  |  \
#      0   1   2
#     / \      |
#    3   4     5
#    |
#    6
PARENTS = [-1, -1, -1, 0, 0, 2, 3]


def test_depths_and_positions():
    assert tree_shape.depths(PARENTS).tolist() == [1, 1, 1, 2, 2, 2, 3]
    assert tree_shape.verify_positions(PARENTS, 10) == [10, 11, 11, 11, 12, 12, 12, 13]


def test_parents_come_first():
    with pytest.raises(ValueError, match="before their children"):
        tree_shape.depths([-1, 2, 0])


def test_verify_mask_is_the_ancestor_mask_with_the_root():
    mask = tree_shape.verify_mask(PARENTS)
    assert np.array_equal(mask, ancestor_mask([-1] + [p + 1 for p in PARENTS]))
    assert mask[7].tolist() == [True, True, False, False, True, False, False, True]  # node 6: root, 0, 3, itself


def test_paths():
    assert tree_shape.ancestor_table(PARENTS)[6].tolist() == [0, 3, 6]
    assert tree_shape.ancestor_table(PARENTS)[1].tolist() == [1, -1, -1]
    assert tree_shape.retrieve_paths(PARENTS).tolist() == [[1, -1, -1], [0, 4, -1], [2, 5, -1], [0, 3, 6]]
    assert tree_shape.children(PARENTS) == [[0, 1, 2], [3, 4], [], [5], [6], [], [], []]
