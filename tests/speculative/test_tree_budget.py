"""The tree budget chooser: acceptance counted for every budget from each verified tree, and the
budget maximising expected tokens per second under a measured verify cost curve."""

from __future__ import annotations

import pytest

from speculant.speculative.tree_budget import (
    EXPLORE,
    MEASURED,
    RESTING_EXPLORE,
    WARMUP,
    TreeBudget,
    measure_points,
)


def test_measure_points_cover_the_budget():
    assert measure_points(16) == [1, 2, 4, 8, 16, 17]
    assert measure_points(1) == [1, 2]


def test_a_tree_counts_for_every_smaller_budget():
    budget = TreeBudget(8, {1: 1.0, 9: 1.0})
    budget.record_tree(8, [0, 2, 5])  # accepted path: nodes 0, 2, 5 (rank order)
    # budget b keeps nodes < b: b=1 -> [0]; b=3 -> [0, 2]; b=6 -> all three
    assert budget.accepted.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3]
    budget.record_tree(4, [])
    assert budget.trees.tolist() == [2, 2, 2, 2, 2, 1, 1, 1, 1]


def _chooser(cost_per_token: float) -> TreeBudget:
    """Trees of 8 nodes whose first 2 nodes are accepted, a third node 1 in 10 trees."""
    budget = TreeBudget(8, {1: 1.0, 9: 1.0 + 8 * cost_per_token})
    for i in range(WARMUP + 40):
        budget.record_tree(8, [0, 1, 7] if i % 10 == 0 else [0, 1])
    return budget


@pytest.mark.parametrize(("cost_per_token", "expected"), [(0.0, 8), (0.5, 2)])
def test_the_budget_follows_the_cost_curve(cost_per_token, expected):
    budget = _chooser(cost_per_token)
    chosen = [budget.choose() for _ in range(2 * EXPLORE)]
    assert budget.chosen == expected
    assert chosen.count(min(8, 2 * expected)) >= 2  # exploration: twice the choice keeps being measured
    assert max(range(1, 9), key=budget.expected_rate) == expected


def test_the_largest_budget_until_warm():
    budget = TreeBudget(8, {1: 1.0, 9: 100.0})
    budget.record_tree(8, [0])
    assert budget.choose() == 8


def test_smaller_budgets_grow_fewer_head_levels():
    """Flat verify cost, costly head levels, only the first node ever accepted: a tree of one
    node (no head forward) beats deeper ones."""
    budget = TreeBudget(8, {1: 1.0, 9: 1.0}, depth=5)
    for _ in range(WARMUP + 8):
        budget.record_tree(8, [0])
        budget.record_draft(4.0, levels=4)  # 1 s per level
    assert [budget.draft_seconds(b) for b in (1, 2, 3, 8)] == [0.0, 1.0, 2.0, 4.0]
    assert max(range(1, 9), key=budget.expected_rate) == 1


def test_no_tree_where_none_pays_and_a_one_node_probe_now_and_then():
    """Verifying costs 3x a plain step per node and a draft is accepted 1 time in 10: a plain
    step (budget 0) is the choice; exploration still verifies a one-node tree every EXPLORE steps."""
    budget = TreeBudget(8, {1: 1.0, 9: 25.0})
    for i in range(WARMUP + 40):
        budget.record_tree(8, [0] if i % 10 == 0 else [])
    chosen = [budget.choose() for _ in range(2 * RESTING_EXPLORE)]
    assert budget.chosen == 0 and set(chosen) == {0, 1} and 2 <= chosen.count(1) <= 3
    assert budget.expected_rate(0) == pytest.approx(1.0)


def test_the_heads_run_after_a_tree_step_is_priced_against_a_plain_step():
    """A one-node tree accepted 45% of the time at 1.3x a plain verify wins 1.45 / 1.3 = 1.12x
    alone, but not once the head's run over the verified rows (0.2 of a step) is counted."""
    budget = TreeBudget(1, {1: 1.0, 2: 1.3})
    for i in range(WARMUP + 80):
        budget.record_tree(1, [0] if i % 20 < 9 else [])
    budget.choose()
    assert budget.choose() == 1
    budget.record_feed(0.2)
    assert budget.draft_seconds(0) == 0.0 and budget.draft_seconds(1) == pytest.approx(0.2)
    assert budget.choose() == 0


def test_measured_steps_replace_the_estimate():
    """The parts' estimate makes a one-node tree pay; whole steps measured at each budget say a
    plain step pays more, and after MEASURED steps at both the choice follows them."""
    budget = TreeBudget(1, {1: 1.0, 2: 1.3})
    for i in range(WARMUP + 80):
        budget.record_tree(1, [0] if i % 2 else [])
    budget.choose()
    assert budget.choose() == 1  # 1.5 / 1.3 against 1 / 1
    for _ in range(MEASURED):
        budget.record_step(0, 1.0)
        budget.record_step(1, 1.6)
    assert budget.step_seconds(1) == pytest.approx(1.6) and budget.choose() == 0
