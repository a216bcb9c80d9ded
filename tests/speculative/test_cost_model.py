"""The step cost model recovers a linear cost from timings and follows a changed one."""

from __future__ import annotations

import random

import pytest

from speculant.speculative.cost_model import MovingAverage, StepCostModel


def synthetic(a: float, b: float, c: float, n: int, seed: int = 0):
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        ks = [rng.randint(0, 8) for _ in range(rng.randint(1, 16))]
        context = rng.randint(10, 4000) * len(ks)
        samples.append((ks, context, a + b * sum(k + 1 for k in ks) + c * context / 1000))
    return samples


def test_fit_recovers_the_coefficients():
    model = StepCostModel()
    model.fit(synthetic(0.042, 0.006, 0.003, 300))
    assert model.theta == pytest.approx([0.042, 0.006, 0.003], rel=0.02)
    assert model.predict([4], 1000) == pytest.approx(0.042 + 0.006 * 5 + 0.003, rel=0.02)


def test_online_correction_moves_toward_new_timings():
    model = StepCostModel()
    model.fit(synthetic(0.02, 0.002, 0.001, 200, seed=1))
    before = model.predict([3, 3], 2000)
    new = synthetic(0.05, 0.004, 0.001, 300, seed=2)
    target = 0.05 + 0.004 * 8 + 0.002
    model.fit(new[:20])
    middle = model.predict([3, 3], 2000)
    model.fit(new[20:])
    after = model.predict([3, 3], 2000)
    assert abs(middle - target) < abs(before - target)
    assert after == pytest.approx(target, rel=0.05)


def test_prediction_stays_positive_and_prior_orders_k():
    model = StepCostModel()
    assert 0 < model.predict([0], 0) < model.predict([4], 0) < model.predict([4, 4], 0)


def test_moving_average_starts_at_the_prior_then_follows():
    avg = MovingAverage(0.5)
    assert avg.value == 0.5
    avg.update(0.1)
    assert avg.value == pytest.approx(0.1)  # the first sample counts fully
    for _ in range(100):
        avg.update(0.3)
    assert avg.value == pytest.approx(0.3, rel=1e-3)
