"""Choosing each request's speculation length k from measured acceptance and measured cost.

A pure function: given each request's chance that draft slot i is accepted (given slots < i
were), its largest allowed k, and the cost of a step as a function of the per-request k's, pick
the k's that maximise expected emitted tokens per second for the whole batch. k = 0 is plain
decoding for that request.

Expected tokens of a request with k drafts (chain acceptance stops at the first rejection; the
target's bonus or recovered token always comes):
    E[emitted](k) = 1 + sum_{i=1..k} prod_{j<=i} alpha_j
Each increment k -> k+1 adds prod_{j<=k+1} alpha_j, which never grows with k, so raising the k
with the largest next gain first visits the best allocation for every total number of drafts;
the search keeps the allocation with the highest expected tokens per second along that path.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E[tokens emitted] with k drafts whose conditional acceptance chances are `alphas`."""
    return expected_tokens_by_k(alphas, k)[k]


def expected_tokens_by_k(alphas: Sequence[float], k_max: int) -> list[float]:
    """[k_max + 1] `expected_tokens(alphas, k)` for every k = 0..k_max, in one pass."""
    out, survive = [1.0], 1.0
    for i in range(k_max):
        survive *= _at(alphas, i)
        out.append(out[-1] + survive)
    return out


def choose_k(
    alphas: Sequence[Sequence[float]],  # [B][k_max_b] P(slot i accepted | slots < i accepted)
    k_max: Sequence[int],  # [B] upper bound per request (0: this request does not speculate)
    step_cost: Callable[[list[int]], float],  # per-request k's -> seconds for the whole step; a draft more never costs less
    margin: float = 0.0,  # speculate only when the predicted rate beats plain decoding by this fraction
) -> list[int]:
    """Per-request k maximising sum_b E[emitted_b] / step_cost(k); ties keep the smaller k's.
    With a margin, the best allocation must beat all k = 0 by that fraction, so that an
    estimate a few percent too optimistic cannot make speculation cost more than it brings.
    The path stops where no longer allocation can win: each draft still to come adds at most
    the next gain and costs at least nothing (at batch 32 with k <= 8 that skips most of ~256
    steps of the path when drafts are rarely right)."""
    ks = [0] * len(k_max)
    survive = [1.0] * len(k_max)
    gains = [(-_at(alphas[b], 0), b) for b in range(len(k_max)) if k_max[b] > 0]
    heapq.heapify(gains)
    tokens = float(len(k_max))
    remaining = sum(k for k in k_max if k > 0)  # drafts the path has not added yet
    best, best_rate = list(ks), tokens / step_cost(ks) * (1 + margin)
    while gains:
        neg_gain, b = heapq.heappop(gains)
        if neg_gain >= 0:  # nothing left that could be accepted
            break
        ks[b] += 1
        remaining -= 1
        tokens -= neg_gain
        survive[b] = -neg_gain
        seconds = step_cost(ks)
        rate = tokens / seconds
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = list(ks), rate
        if ks[b] < k_max[b]:
            heapq.heappush(gains, (-survive[b] * _at(alphas[b], ks[b]), b))
        if gains and (tokens - gains[0][0] * remaining) / seconds <= best_rate * (1 + 1e-9):
            break  # even every remaining draft at the next gain, at today's cost, would not win
    return best


def _at(alphas: Sequence[float], i: int) -> float:
    """alpha at slot i; slots past the measured ones repeat the last measurement."""
    if not alphas:
        return 0.0
    return min(1.0, max(0.0, alphas[min(i, len(alphas) - 1)]))
