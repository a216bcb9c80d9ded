"""The step cost model recovers a cost that is piecewise in the row count, follows a changed one,
and interpolates the calibration between the row counts it measured."""

from __future__ import annotations

import random

import pytest

from speculant.speculative.cost_model import (
    CONTEXT,
    OVERHEAD,
    ROW_CONTEXT,
    MovingAverage,
    StepCostModel,
    WorkCost,
    non_decreasing,
    rows,
)


def cpu_like(m: int) -> float:
    """Seconds for M rows: 2 rows cost 1.5x one, 2..4 rows the same, then linear (a CPU kernel)."""
    if m == 1:
        return 0.040
    return 0.060 + 0.004 * max(0, m - 4)


def synthetic(law, c: float, n: int, seed: int = 0, max_seqs: int = 16):
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        ks = [rng.randint(0, 8) for _ in range(rng.randint(1, max_seqs))]
        if rng.random() < 0.25:  # a plain step (no request drafts)
            ks = [0] * len(ks)
        context = rng.randint(10, 4000) * len(ks)
        samples.append((ks, context, law(rows(ks)) + c * context / 1000))
    return samples


def test_fit_recovers_a_cost_piecewise_in_rows():
    model = StepCostModel()
    model.fit(synthetic(cpu_like, 0.003, 400, max_seqs=1) + synthetic(cpu_like, 0.003, 400, seed=3))
    for ks, context in [([0], 500), ([1], 500), ([3], 2000), ([4] * 4, 8000), ([0] * 16, 16000)]:
        assert model.predict(ks, context) == pytest.approx(cpu_like(rows(ks)) + 0.003 * context / 1000, rel=0.05)


def test_online_correction_moves_toward_new_timings():
    model = StepCostModel()
    model.fit(synthetic(lambda m: 0.02 + 0.002 * m, 0.001, 200, seed=1))
    before = model.predict([3, 3], 2000)
    new = synthetic(lambda m: 0.05 + 0.004 * m, 0.001, 300, seed=2)
    target = 0.05 + 0.004 * 8 + 0.002
    model.fit(new[:20])
    middle = model.predict([3, 3], 2000)
    model.fit(new[20:])
    after = model.predict([3, 3], 2000)
    assert abs(middle - target) < abs(before - target)
    assert after == pytest.approx(target, rel=0.05)


def test_prediction_stays_positive_and_grows_with_rows():
    model = StepCostModel()
    assert 0 < model.predict([0], 0) < model.predict([4], 0) < model.predict([4, 4], 0)
    model.theta[1] = -1.0  # a noisy fit that makes 2 rows look cheaper than 1
    assert model.predict([1], 0) >= model.predict([0], 0) > 0


def test_calibration_prices_a_two_row_verify_as_measured_not_on_a_line():
    samples = [([k], 64, cpu_like(k + 1)) for k in (0, 1, 2, 3, 8)] + [([0], 512, cpu_like(1) + 0.001)]
    model = StepCostModel.calibrated(samples)
    assert model.predict([1], 64) / model.predict([0], 64) == pytest.approx(1.5, rel=3e-3)  # 2-4 rows trade a little with the context terms
    for k in (0, 1, 2, 3, 8):
        assert model.predict([k], 64) == pytest.approx(cpu_like(k + 1), rel=5e-3)  # the context terms share the fit
    assert cpu_like(4) < model.predict([5], 64) < cpu_like(9)  # between measured rows: interpolated
    assert model.predict([15], 64) > model.predict([8], 64)  # past them: extrapolated, still growing
    assert model.predict([0], 960) == pytest.approx(cpu_like(1) + 0.002, rel=1e-3)  # 0.001 s per 448 tokens


def test_moving_average_starts_at_the_prior_then_follows():
    avg = MovingAverage(0.5)
    assert avg.value == 0.5
    avg.update(0.1)
    assert avg.value == pytest.approx(0.1)  # the first sample counts fully
    for _ in range(100):
        avg.update(0.3)
    assert avg.value == pytest.approx(0.3, rel=1e-3)


def test_the_curve_equals_predict():
    model = StepCostModel.calibrated([([k], 64, cpu_like(k + 1)) for k in (0, 1, 2, 3, 8)] + [([0] * 8, 512, 0.2)])
    model.theta[3] -= 0.01  # a dip the prediction smooths away
    model.theta[OVERHEAD] = 0.004  # a speculative step's overhead
    for ks in ([0], [1], [3], [7], [2] * 5, [0] * 40, [0] * 39 + [1], [8] * 300):
        curve = model.curve(700, len(ks))
        assert curve(sum(k + 1 for k in ks)) == pytest.approx(model.predict(ks, 700), rel=1e-12)


def test_a_speculative_step_s_fixed_overhead_is_learnt():
    """At batch 16 one request drafting one token costs a fixed 5 ms more than a plain step (the
    verify path), which f(M) alone would price at a sixteenth of a row."""
    law = lambda m: 0.030 + 0.001 * m  # noqa: E731
    rng = random.Random(0)
    samples = []
    for _ in range(300):
        ks = [0] * 16 if rng.random() < 0.4 else [rng.choice((0, 0, 0, 0, 1, 2, 4)) for _ in range(16)]
        samples.append((ks, 8000, law(rows(ks)) + (0.005 if any(ks) else 0.0)))
    model = StepCostModel.calibrated([([0] * 16, 8000, law(16)), ([1] * 16, 8000, law(32)), ([0], 500, law(1)), ([4], 500, law(5))])
    model.fit(samples)
    assert model.predict([0] * 16, 8000) == pytest.approx(law(16), rel=0.03)
    assert model.predict([1] + [0] * 15, 8000) == pytest.approx(law(17) + 0.005, rel=0.03)


def test_plain_steps_slower_than_calibrated_raise_the_price_of_verifying_too():
    """A cached calibration, the machine 30% slower today: a batch of 16's plain steps excite only
    the 16-row knot. Moved alone, it priced 16 drafts (32 rows) at a few ms over the plain step
    (17 drafts once measured 86 ms against 58); the knots share a level, so they move together."""
    law = lambda m: 0.030 + 0.001 * m  # noqa: E731
    calibration = [([k], 64, law(k + 1)) for k in range(9)]
    calibration += [([0] * 8, 512, law(8)), ([1] * 8, 512, law(16)), ([8] * 8, 512, law(72))]
    calibration += [([0] * 32, 2048, law(32)), ([1] * 32, 2048, law(64)), ([8] * 32, 2048, law(288))]
    model = StepCostModel.calibrated(calibration)
    for i in range(20):
        model.update([0] * 16, 1000 + 16 * i, 1.3 * law(16))
    plain, drafting = model.predict([0] * 16, 1400), model.predict([2] * 8 + [0] * 8, 1400)
    assert plain == pytest.approx(1.3 * law(16), rel=0.05)
    assert drafting - plain > 0.75 * (law(32) - law(16))


def test_one_slow_row_count_is_averaged_with_its_neighbours_not_carried_to_every_longer_verify():
    """Knots out of order are pooled (least-squares monotone), so a 3-row step measured slow
    once does not price 4, 5 and 6 rows at its time."""
    assert non_decreasing([136, 129, 215, 168, 164, 171]) == pytest.approx([132.5, 132.5, 179.5, 179.5, 179.5, 179.5])
    assert non_decreasing([1, 2, 3]) == [1, 2, 3]
    assert non_decreasing([3, 1], [1, 99]) == pytest.approx([1.02, 1.02])  # the sure knot holds the pool
    model = StepCostModel.calibrated([([k], 64, cpu_like(k + 1)) for k in range(9)])
    model.theta[2] += 0.05  # the 3-row knot measured slow
    assert model.predict([4], 64) < cpu_like(5) + 0.05 / 2


def test_steps_at_one_batch_and_context_cannot_swing_the_context_terms_negative():
    """A batch of 16 at ~800 tokens of context: its knot and the context terms are nearly
    collinear, and one plain step measured faster than predicted once swung the context
    coefficient to -1.5 s per 1000 tokens and the knot to 1.4 s; the curve (which prices no
    negative coefficient) then priced a 240 ms plain step at 1.1 s. Measured steps of that run."""
    law = {1: 0.177, 2: 0.181, 3: 0.198, 9: 0.197}  # one sequence at 64 tokens, by rows
    samples = [([m - 1], 64, s) for m, s in law.items()] + [([0], 512, 0.165), ([8], 512, 0.196)]  # longer context, measured faster
    samples += [([0] * 8, 512, 0.173), ([1] * 8, 512, 0.229), ([8] * 8, 512, 0.634)]
    samples += [([0] * 32, 2048, 0.374), ([1] * 32, 2048, 0.585), ([8] * 32, 2048, 2.539)]
    model = StepCostModel.calibrated(samples)
    assert model.theta[CONTEXT] >= 0 and model.theta[ROW_CONTEXT] >= 0
    mixed = [1, 3, 1, 5, 5, 1, 1, 1, 5, 1, 5, 5, 5, 2, 5, 1]
    steps = [([0] * 16, 740, 0.314), ([1] * 8 + [0] * 8, 756, 0.366), ([0] * 16, 778, 0.232), ([6] * 16, 794, 0.948), (mixed, 866, 0.611)]
    for ks, context, seconds in steps + [([0] * 16, 900 + 16 * i, 0.240) for i in range(5)]:
        model.update(ks, context, seconds)
        assert min(model.theta[CONTEXT], model.theta[ROW_CONTEXT], model.theta[OVERHEAD]) >= 0
        assert model.predict([0] * 16, context) < 0.4  # a plain step: 230-310 ms measured
    assert model.predict([0] * 16, 1000) == pytest.approx(0.240, rel=0.1)


def test_a_proposer_s_work_is_priced_by_its_forwards_and_rows():
    """A draft forward costs 55 ms for one row and 87 ms for 16: one average per forward would
    price a whole batch's drafting at a lone request's."""
    cost = WorkCost(prior_s=0.05)
    assert cost(3, 3) == pytest.approx(0.15)  # the prior, per forward, until measured
    for forwards, n in [(1, 1), (2, 2), (1, 16), (3, 40), (2, 17)] * 4:
        cost.update(forwards, n, 0.053 * forwards + 0.002 * n)
    assert cost(1, 1) == pytest.approx(0.055, rel=0.02) and cost(1, 16) == pytest.approx(0.085, rel=0.02)
    lone = WorkCost()
    for _ in range(5):
        lone.update(2, 2, 0.12)  # one row a forward, always: the forwards take the time
    assert (lone.a, lone.b) == pytest.approx((0.06, 0.0), abs=1e-4)
    lone.update(0, 0, 5.0)  # no forwards: nothing to learn
    assert lone(1, 1) == pytest.approx(0.06, abs=1e-4)


def test_a_spike_in_a_proposer_s_cost_is_undone_by_the_next_sample():
    """A head refill timed at 100 ms once (the machine, a first call) against 3 ms: fitted in
    full, and the next sample, SPIKE times below the estimate, starts the fit over; samples that
    differ by their work (one request fed, then 16) are fitted, not started over."""
    feed = WorkCost()
    for _ in range(5):
        feed.update(1, 1, 0.003)
    feed.update(1, 1, 0.100)
    assert feed(1, 1) > 0.02  # the spike counts
    feed.update(1, 1, 0.003)
    assert feed(1, 1) == pytest.approx(0.003)
    grows = WorkCost()
    for n in (1, 16, 1, 16, 4):
        grows.update(1, n, 0.002 + 0.001 * n)
    assert grows(1, 1) == pytest.approx(0.003, rel=0.05) and grows(1, 16) == pytest.approx(0.018, rel=0.05)
    catch_up = MovingAverage(0.0, restarts=True)
    catch_up.update(0.005)  # 5 ms a token, once
    catch_up.update(0.0002)
    assert catch_up.value == pytest.approx(0.0002)
    plain = MovingAverage(0.0)
    plain.update(0.005)
    plain.update(0.0002)
    assert plain.value == pytest.approx(0.0002 + 0.5 * 0.0048)


def test_one_slow_step_moves_the_fit_little_and_a_lasting_change_is_followed(monkeypatch):
    """Batch 1, smollm2-like: a first 9-row verify once took 80 ms against 31 predicted. Fitted in
    full (plain least squares), it moved the 9-row price most of the way there; it counts as a
    few ordinary surprises now, and steps that stay slower (the machine slower today) are still
    followed as fast as plain least squares follows them."""
    import speculant.speculative.cost_model as cost_model

    law = lambda m: 0.028 + 0.0004 * m  # noqa: E731

    def run():
        model = StepCostModel.calibrated([([k], 64, law(k + 1)) for k in range(9)])
        rng = random.Random(0)
        for _ in range(30):
            k = rng.choice((0, 0, 2, 4))
            model.update([k], 200, law(k + 1) * rng.uniform(0.98, 1.02))
        before = model.predict([8], 200)
        model.update([8], 200, 0.080)
        moved = (model.predict([8], 200) - before) / (0.080 - before)
        for _ in range(20):  # every step 30% slower from here on
            k = rng.choice((0, 0, 2, 4))
            model.update([k], 200, 1.3 * law(k + 1))
        return moved, [model.predict([k], 200) for k in (0, 2, 4)]

    moved, followed = run()
    monkeypatch.setattr(cost_model, "HUBER", float("inf"))
    moved_fully, followed_fully = run()
    assert moved < 0.15 and moved_fully > 0.8
    assert followed[0] == pytest.approx(followed_fully[0], rel=0.02)  # the plain step: as fast as plain least squares
    for k, seconds in zip((0, 2, 4), followed):  # from 0.77 of the new times to about 0.9 in 20 steps
        assert 0.88 * 1.3 * law(k + 1) < seconds < 1.02 * 1.3 * law(k + 1)
