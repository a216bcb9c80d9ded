"""The k chooser is a pure function of acceptance chances and step cost."""

from __future__ import annotations

import itertools

import pytest

from speculant.speculative.k_chooser import choose_k, expected_tokens, expected_tokens_by_k


def linear_cost(base: float, per_token: float):
    return lambda ks: base + per_token * sum(k + 1 for k in ks)


def test_expected_tokens_of_a_chain():
    assert expected_tokens([1.0], 4) == 5.0
    assert expected_tokens([0.0], 4) == 1.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.8], 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)  # last alpha repeats


def test_a_draft_that_is_always_right_gets_the_largest_k():
    assert choose_k([[1.0] * 8, [1.0] * 8], [8, 5], linear_cost(1.0, 0.1)) == [8, 5]


def test_a_draft_that_is_never_right_gets_zero():
    assert choose_k([[0.0] * 4, [1.0] * 4], [4, 4], linear_cost(1.0, 0.1)) == [0, 4]


def test_costs_flat_in_k_give_the_largest_k():
    assert choose_k([[0.3, 0.2, 0.1], [0.05]], [3, 6], lambda ks: 1.0) == [3, 6]


def test_expensive_verification_turns_speculation_off():
    # a second token costs as much as the first: a 40% draft cannot pay for itself
    assert choose_k([[0.4]], [4], lambda ks: 1.0 + sum(ks)) == [0]


def test_a_margin_keeps_plain_decoding_unless_speculation_gains_more():
    cost = linear_cost(1.0, 0.1)  # one row costs 1.1, two 1.2
    assert choose_k([[0.2]], [1], cost) == [1]  # 1.2 / 1.2 = 1.0 > 1 / 1.1 = 0.909: +10%
    assert choose_k([[0.2]], [1], cost, margin=0.05) == [1]
    assert choose_k([[0.2]], [1], cost, margin=0.15) == [0]  # +10% is below the margin
    assert choose_k([[1.0] * 4], [4], cost, margin=0.15) == [4]


def test_requests_without_room_are_left_at_zero():
    assert choose_k([[1.0], [1.0]], [0, 3], lambda ks: 1.0) == [0, 3]


@pytest.mark.parametrize("seed", range(5))
def test_matches_exhaustive_search_on_small_batches(seed):
    import random

    rng = random.Random(seed)
    alphas = [[rng.random() for _ in range(3)] for _ in range(3)]
    k_max = [3, 2, 3]
    base, per_token, per_max = rng.uniform(0.5, 2), rng.uniform(0.01, 0.5), rng.uniform(0, 0.3)

    def cost(ks):  # verify tokens plus a draft chain as long as the longest k
        return base + per_token * sum(k + 1 for k in ks) + per_max * max(ks)

    def rate(ks):
        return sum(expected_tokens(a, k) for a, k in zip(alphas, ks)) / cost(ks)

    best = max(itertools.product(*(range(m + 1) for m in k_max)), key=rate)
    chosen = choose_k(alphas, k_max, cost)
    assert rate(chosen) >= rate(best) * 0.97


def test_expected_tokens_by_k_tables_expected_tokens():
    alphas = [0.9, 0.5, 0.25]
    assert expected_tokens_by_k(alphas, 5) == pytest.approx([expected_tokens(alphas, k) for k in range(6)])


@pytest.mark.parametrize("seed", range(20))
def test_stopping_early_keeps_the_full_path_s_choice(seed):
    """The path stops once no longer allocation can win; it chooses what walking every draft
    would, for costs that never fall when a draft is added (batch 32, k <= 8)."""
    import heapq
    import random

    rng = random.Random(seed)
    alphas = [[rng.random() for _ in range(8)] for _ in range(32)]
    k_max = [rng.choice([0, 2, 8, 8]) for _ in range(32)]
    base, per_row, jump = rng.uniform(0.05, 0.1), rng.uniform(1e-4, 2e-3), rng.uniform(0, 0.01)  # most seeds draft some

    def cost(ks):
        return base + per_row * sum(k + 1 for k in ks) + (jump if any(ks) else 0.0) + 0.002 * max(ks, default=0)

    def full_path(margin):
        ks, survive, tokens = [0] * 32, [1.0] * 32, 32.0
        gains = [(-alphas[b][0], b) for b in range(32) if k_max[b]]
        heapq.heapify(gains)
        best, best_rate = list(ks), tokens / cost(ks) * (1 + margin)
        while gains:
            g, b = heapq.heappop(gains)
            ks[b] += 1
            tokens -= g
            survive[b] = -g
            if tokens / cost(ks) > best_rate * (1 + 1e-9):
                best, best_rate = list(ks), tokens / cost(ks)
            if ks[b] < k_max[b]:
                heapq.heappush(gains, (-survive[b] * alphas[b][ks[b]], b))
        return best

    for margin in (0.0, 0.05):
        assert choose_k(alphas, k_max, cost, margin) == full_path(margin)
