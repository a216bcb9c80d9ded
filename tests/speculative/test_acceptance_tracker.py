"""Per-request acceptance, smoothed and fed back into the k chooser."""

from __future__ import annotations

import numpy as np
import pytest

from speculant.speculative.acceptance_tracker import AcceptanceTracker
from speculant.speculative.cost_model import StepCostModel
from speculant.speculative.k_chooser import choose_k

K_MAX = 8


def run_steps(tracker: AcceptanceTracker, accepts, steps: int) -> list[int]:
    """Choose k as adaptive k does (a posterior quantile drawn per step, the prior cost model), verify with
    `accepts(k)` accepted; the k's chosen."""
    cost, rng = StepCostModel(), np.random.default_rng(0)
    chosen = []
    for _ in range(steps):
        (k,) = choose_k([tracker.draw("r", K_MAX, None, float(rng.standard_normal()))], [K_MAX], lambda ks: cost.predict(ks, 100))
        chosen.append(k)
        if k:
            tracker.record("r", k, accepts(k))
        else:
            tracker.idle("r")
            tracker.idle_step()
    return chosen


def test_a_new_request_starts_optimistic_but_not_certain():
    alphas = AcceptanceTracker().alphas("new", 3)
    assert all(0.5 < a < 1.0 for a in alphas)


def test_always_right_converges_to_the_largest_k():
    tracker = AcceptanceTracker()
    chosen = run_steps(tracker, lambda k: k, 20)
    assert chosen[-5:] == [K_MAX] * 5
    assert tracker.alphas("r", K_MAX)[0] > 0.95


def test_never_right_goes_to_zero_after_a_few_steps():
    chosen = run_steps(AcceptanceTracker(), lambda k: 0, 15)
    assert chosen[0] > 0
    assert chosen[-1] == 0 and chosen.index(0) <= 12


def test_never_right_probes_again_only_now_and_then():
    chosen = run_steps(AcceptanceTracker(), lambda k: 0, 200)
    assert 0 < sum(k > 0 for k in chosen[50:]) <= 35  # mostly plain decoding, a probe now and then


def test_conditional_acceptance_by_slot():
    tracker = AcceptanceTracker(prior_accept=0.0 + 1e-9, prior_reject=1e-9, decay=1.0, chain_weight=1e-9)
    for _ in range(10):
        tracker.record("r", 3, 1)  # slot 0 accepted, slot 1 rejected, slot 2 never reached
    a = tracker.alphas("r", 3)
    assert a[0] == pytest.approx(1.0) and a[1] == pytest.approx(0.0, abs=1e-6)
    assert a[2] == pytest.approx(0.0, abs=1e-6)  # never reached: what the slot before measured


def test_a_slot_never_reached_repeats_the_slot_before():
    tracker = AcceptanceTracker()
    for _ in range(30):
        tracker.record("r", 1, 0)  # k = 1, always rejected: slot 1 never verified
    a = tracker.alphas("new", 4)
    assert a[0] < 0.1 and max(a[1:]) < 0.1  # not the optimistic prior's 0.8


def test_a_new_kind_of_draft_starts_from_every_kind_s_evidence():
    tracker = AcceptanceTracker()
    for _ in range(30):
        tracker.record("r", 2, 0, key=(3, False))
    fresh = tracker.alphas("new", 2, key=(5, True))
    assert fresh[0] < 0.1
    tracker.record("s", 2, 2, key=(5, True))
    assert tracker.alphas("new", 2, key=(5, True))[0] > fresh[0]  # its own kind's evidence counts at once


def test_release_forgets_the_request():
    tracker = AcceptanceTracker()
    tracker.record("r", 4, 0)
    tracker.release("r")
    assert tracker.alphas("r", 2) == tracker.alphas("x", 2)  # what is left is the pooled evidence


def test_a_request_s_few_rejections_do_not_outweigh_its_kind_s_evidence():
    tracker = AcceptanceTracker()
    for i in range(200):
        tracker.record(f"other{i % 20}", 2, 1 if i % 2 else 0)  # slot 0 accepted half the time
    for _ in range(2):
        tracker.record("r", 2, 0)
    assert 0.25 < tracker.alphas("r", 1)[0] < 0.5


def test_one_rejection_at_a_thinly_verified_slot_does_not_condemn_it():
    """Adaptive k at batch 1 verifies slot 1 rarely: its first rejection once read as 0.14 (the
    one outcome counted at every level: every kind, the kind, the request) and held k at 1 for
    the rest of the answer. Slot i > 0 leans on slot i - 1 (chain_weight), a kind that is the
    only kind is every kind (counted once)."""
    tracker = AcceptanceTracker()
    for accepted in (1, 0, 1, 1, 0, 1):
        tracker.record("r", 1, accepted)
    tracker.record("r", 2, 1)  # slot 0 accepted, slot 1 rejected
    a = tracker.alphas("r", 3)
    assert a[1] > 0.4 and a[2] > 0.5
    for _ in range(10):
        tracker.record("r", 2, 1)  # slot 1 keeps failing: the evidence takes over
    assert tracker.alphas("r", 2)[1] < 0.2
