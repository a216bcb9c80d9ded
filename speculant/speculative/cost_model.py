"""A cost model of one decode step, fitted at start-up and corrected online from the engine's
step timings.

    t(step) = f(M) + (c + a * M / B) * (context tokens / 1000) + o * [some k > 0]
              + draft cost (the proposer's own measured seconds per draft forward x forwards)

where M = sum_b (k_b + 1) is the number of rows the target's matmuls see. f is piecewise linear
over knots in M (1, 2, 3, 4, 5, 6, 8, 12, 16, ...), because on a CPU the cost of a product is far
from linear in its rows: a 2-row verify can cost 1.5x a 1-row step while 4 rows cost about the
same as 2 (the kernel changes with the row count). A straight line through the 1-row and
(k+1)-row costs underprices small k's, and small k's are what a low acceptance picks.

The context costs twice over: c per token of KV read (once per sequence, whatever its rows)
and a per token of KV for each of a sequence's M / B rows (the attention's arithmetic). Measured
at batch 32 on smollm2 (3.3k tokens of context): a plain step 88 ms, a step verifying 3 rows a
sequence 255 ms; with c alone a fit over such steps raised c to explain them and priced the plain
step at 2x its time, so that drafting looked cheap.

o is what a speculative step costs whatever its rows (assembling drafts, verifying, a second
attention group): without it, a batch of 16 where one request drafts looks almost free.

The coefficients (f at every knot, c, a and o) are fitted by recursive least squares, forgetting
old steps (factor 0.98: about the last 50 decode steps count), from a prior: the start-up
calibration (`speculative.calibration`) or, without one, 10 ms a step plus 1 ms a row. Knots the
calibration did not reach are interpolated with a smoothness penalty. The prior lets the knots
move together before it lets them move apart (a level shared by all, as uncertain as the 1-row
step, and each knot within about a third of its value on its own): a batch's plain steps excite
only its own knot, and when they measured 25% slower than calibrated (a cached calibration, the
machine slower today) independent knots once priced 17 drafts at batch 16 as free, and the step
took 86 ms against 58. Pure arithmetic: no engine, no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

KNOTS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
PRIOR_STEP_S, PRIOR_ROW_S, PRIOR_CONTEXT_S = 0.01, 0.001, 0.0  # the uncalibrated prior
OVERHEAD_PRIOR_S = 0.05  # prior std of a speculative step's fixed overhead (its mean: 0; free to take what rows cannot explain)
KNOT_PRIOR = 0.35  # prior std of each knot on its own, as a fraction of its value
HUBER = 3.0  # a step's surprise counts up to this many times the typical one (a one-off slow step moves the fit little)
SURPRISE_FLOOR = 0.03  # the typical surprise is at least this share of the predicted step
LEVEL_PRIOR = 1.0  # prior std of a level every knot shares, in units of the 1-row knot (the machine twice as slow or fast)
SPIKE = 3.0  # a proposer's cost estimate this many times what a sample measured was a spike: start over (`WorkCost`)

Sample = tuple[Sequence[int], int, float]  # (k per sequence, context tokens, seconds)


def rows(ks: Sequence[int]) -> int:
    """M: rows of the target's products for a step whose sequences verify k_b + 1 tokens."""
    return sum(k + 1 for k in ks)


CONTEXT, ROW_CONTEXT, OVERHEAD = len(KNOTS), len(KNOTS) + 1, len(KNOTS) + 2  # theta's coefficients after f's knots
NUM_COEFFICIENTS = len(KNOTS) + 3


def features(ks: Sequence[int], context_tokens: int) -> np.ndarray:
    """[NUM_COEFFICIENTS]: the hat functions of M over the knots (linear extrapolation past the
    last knot), context tokens / 1000, that times the rows per sequence M / B, and 1 when some
    sequence verifies drafts."""
    m = float(max(1, rows(ks)))
    x = np.zeros(NUM_COEFFICIENTS)
    j = min(bisect.bisect_right(KNOTS, m) - 1, len(KNOTS) - 2)  # segment [KNOTS[j], KNOTS[j+1]]
    w = (m - KNOTS[j]) / (KNOTS[j + 1] - KNOTS[j])
    x[j], x[j + 1] = 1.0 - w, w
    x[CONTEXT] = context_tokens / 1000.0
    x[ROW_CONTEXT] = x[CONTEXT] * m / max(1, len(ks))
    x[OVERHEAD] = 1.0 if m > len(ks) else 0.0
    return x


def prior_theta() -> np.ndarray:
    return np.array([PRIOR_STEP_S + PRIOR_ROW_S * k for k in KNOTS] + [PRIOR_CONTEXT_S, PRIOR_CONTEXT_S, 0.0])


class StepCostModel:
    def __init__(self, prior: Sequence[float] | None = None, noise_s: float = 1e-3, forget: float = 0.98) -> None:
        self.theta = prior_theta() if prior is None else np.array(prior, dtype=float)  # [NUM_COEFFICIENTS]
        scale = np.maximum(np.abs(self.theta), 1e-3)  # prior std of each coefficient
        scale[: len(KNOTS)] *= KNOT_PRIOR
        scale[OVERHEAD] = OVERHEAD_PRIOR_S
        self.P = np.diag((scale / noise_s) ** 2)  # covariance of theta over the timing noise
        level = LEVEL_PRIOR * max(abs(float(self.theta[0])), 1e-3) / noise_s
        self.P[: len(KNOTS), : len(KNOTS)] += level**2  # the knots move together first: a slower plain step slows verifies too
        self._P_trace_max = float(np.trace(self.P)) * 1e3  # no wind-up while the regressors do not vary
        self.forget = forget
        self.num_updates = 0
        self.surprise_s = 0.0  # typical |measured - predicted| of a step (moving average of the clipped ones, from 0: the floor rules first)
        self.calibration: list[tuple[list[int], int, float]] = []  # the samples the prior was fitted to

    @classmethod
    def calibrated(cls, samples: Sequence[Sample], smoothness: float = 1e-8) -> StepCostModel:
        """A model whose prior is the least-squares fit of measured (ks, context, seconds) samples
        (`speculative.calibration`), second differences of f penalised so that knots between and
        beyond the measured row counts are interpolated; the prior weighs as much as a few steps."""
        x = np.stack([features(ks, context)[:OVERHEAD] for ks, context, _ in samples])  # [S, OVERHEAD]: forwards, no overhead
        y = np.array([seconds for _, _, seconds in samples])
        n = len(KNOTS)
        d2 = np.zeros((n - 2, OVERHEAD))  # second differences of f over the knots, per unit of M
        for i in range(n - 2):
            h0, h1 = KNOTS[i + 1] - KNOTS[i], KNOTS[i + 2] - KNOTS[i + 1]
            d2[i, i], d2[i, i + 1], d2[i, i + 2] = 1 / h0, -(1 / h0 + 1 / h1), 1 / h1
        context = np.zeros((2, OVERHEAD))  # the context terms too are penalised: of the fits that match
        context[0, CONTEXT] = context[1, ROW_CONTEXT] = 1.0  # the samples, the rows explain what they can
        lhs = np.concatenate([x, np.sqrt(smoothness) * d2, np.sqrt(smoothness * 1e-3) * context])
        rhs = np.concatenate([y, np.zeros(n)])
        theta = np.zeros(OVERHEAD)
        free = list(range(OVERHEAD))
        while True:  # least squares with the context coefficients at least 0 (a noisy long-context point can look cheaper)
            theta[free] = np.linalg.lstsq(lhs[:, free], rhs, rcond=None)[0]
            negative = [c for c in (CONTEXT, ROW_CONTEXT) if c in free and theta[c] < 0]
            if not negative:
                break
            worst = min(negative, key=lambda c: theta[c])
            free.remove(worst)
            theta[worst] = 0.0
        model = cls(prior=np.append(theta, 0.0))  # the overhead is learnt online
        model.calibration = [(list(ks), int(c), float(s)) for ks, c, s in samples]
        return model

    def predict(self, ks: Sequence[int], context_tokens: int) -> float:
        """Seconds for the target's part of a decode step (never below a microsecond); more rows
        or more context never cost less."""
        return self.curve(context_tokens, len(ks))(rows(ks))

    def curve(self, context_tokens: int, num_seqs: int) -> Callable[[int], float]:
        """M -> `predict` of a step of num_seqs sequences with M rows at this context, without
        numpy per call (the k chooser asks it once per draft slot it considers). More rows never
        cost less: f is made non-decreasing, and a speculative step's knots past the plain step's
        are made so among themselves (the overhead, not those knots, is its jump over plain).
        Knots out of order are averaged (`non_decreasing`), not raised to the highest before
        them: one slow measurement at 3 rows must not price every longer verify as slow too.
        The average weighs each knot by how sure the fit is of it: at batch 16 the 12-row knot,
        which only the prior sets, once held the measured 16-row plain step 15% above its time."""
        knots = self.theta[: len(KNOTS)].tolist()
        sure = (1.0 / np.diag(self.P)[: len(KNOTS)]).tolist()  # a knot the steps measured outweighs one only the prior sets
        plain_f = non_decreasing(knots, sure)
        last = len(KNOTS) - 2
        j0 = min(bisect.bisect_right(KNOTS, max(1, num_seqs)) - 1, last)  # the plain step's segment
        spec_f = plain_f[: j0 + 1] + non_decreasing(knots[j0 + 1 :], sure[j0 + 1 :])
        per_seq = max(0.0, float(self.theta[CONTEXT])) * context_tokens / 1000.0
        per_row = max(0.0, float(self.theta[ROW_CONTEXT])) * context_tokens / 1000.0 / max(1, num_seqs)
        overhead = max(0.0, float(self.theta[OVERHEAD]))

        def at(f: list[float], m: int) -> float:
            j = min(bisect.bisect_right(KNOTS, m) - 1, last)
            w = (m - KNOTS[j]) / (KNOTS[j + 1] - KNOTS[j])
            return (1.0 - w) * f[j] + w * f[j + 1]

        plain = max(1e-6, at(plain_f, max(1, num_seqs)) + per_seq + per_row * max(1, num_seqs))

        def seconds(m: int) -> float:
            m = max(1, m)
            if m <= num_seqs:
                return max(1e-6, at(plain_f, m) + per_seq + per_row * m)
            return max(plain, at(spec_f, m) + per_seq + per_row * m + overhead)

        return seconds

    def update(self, ks: Sequence[int], context_tokens: int, seconds: float) -> None:
        """One recursive-least-squares step towards a measured step time, its surprise clipped at
        HUBER times the typical one (Huber's loss): every step is fitted, and one slow step moves
        the fit by no more than a few ordinary ones. Steps at row counts not run before were once
        left out of the fit as one-off kernel set-up (smollm2's first 9-row verify at batch 1 took
        80 ms against 31 predicted; fitted in full, it priced every speculative step 44 ms higher
        and drafting stopped for the rest of the answer); no such set-up was found when measured,
        and leaving them out kept the fit from learning the row counts it had not run (the qwen
        pair drafted at batch 32 at 0.73x of plain). A lasting change raises the typical surprise
        with it, and is followed as fast as plain least squares follows it."""
        x = features(ks, context_tokens)
        predicted = float(x @ self.theta)
        surprise = seconds - predicted
        limit = HUBER * max(self.surprise_s, SURPRISE_FLOOR * abs(predicted), 1e-6)
        weight = min(1.0, limit / max(abs(surprise), 1e-12))  # Huber's weight: a surprise past the limit counts as the limit
        self.surprise_s += 0.1 * (weight * abs(surprise) - self.surprise_s)
        # In place and with few numpy calls: a step's fit runs on the host after the step's
        # products have flushed the caches, where each call costs several microseconds.
        Px = self.P @ x
        xPx = float(x @ Px)
        self.theta = self.theta + Px * (weight * surprise / (self.forget + xPx))
        gain = Px * (weight / (self.forget + weight * xPx))  # what it teaches: as much as `weight` of a step
        self.P -= np.outer(gain, Px)
        self.P /= self.forget
        trace = float(self.P.trace())
        if trace > self._P_trace_max:
            self.P *= self._P_trace_max / trace
        if min(self.theta[CONTEXT], self.theta[ROW_CONTEXT], self.theta[OVERHEAD]) < 0:
            for c in (CONTEXT, ROW_CONTEXT, OVERHEAD):
                if self.theta[c] < 0:
                    self._condition_at_zero(c)
            for c in (CONTEXT, ROW_CONTEXT, OVERHEAD):  # conditioning one may leave another a rounding below 0
                self.theta[c] = max(0.0, self.theta[c])
        self.num_updates += 1

    def _condition_at_zero(self, c: int) -> None:
        """Coefficient c cannot be negative (more context, a speculative step never cost less):
        the fit is conditioned on c = 0, so the coefficients correlated with it take up what it
        was explaining. Without this, steps at one batch size and context (the knot of that
        batch and the context terms nearly collinear) once swung c to -1.5 s per 1000 tokens and
        the knot up by as much; `curve`, which never prices with a negative c, then priced
        240 ms plain steps at 0.8-1.1 s. c keeps its own uncertainty, uncorrelated, to rise again."""
        column = self.P[:, c].copy()
        variance = column[c]
        self.theta = self.theta - column / variance * self.theta[c]
        self.P = self.P - np.outer(column, column) / variance
        self.P[c, c] = variance

    def fit(self, samples: Sequence[Sample]) -> None:
        """Feed (ks, context tokens, seconds) samples in order."""
        for ks, context, seconds in samples:
            self.update(ks, context, seconds)


def non_decreasing(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence nearest to `values` in (weighted) least squares (pool adjacent
    violators: a run out of order is replaced by its weighted mean)."""
    weights = [1.0] * len(values) if weights is None else weights
    blocks: list[list[float]] = []  # [weighted sum, weight, count] of each pooled run
    for v, w in zip(values, weights):
        blocks.append([v * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, weight, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += weight
            blocks[-1][2] += count
    return [total / weight for total, weight, count in blocks for _ in range(count)]


class WorkCost:
    """seconds = a * forwards + b * rows (a, b >= 0): a proposer's own forwards, whose cost grows
    with the rows they carry (a 0.5B fp32 draft: 55 ms for 1 row, 87 ms for 16; its feed after a
    step: 55 ms for one request, 110 ms for 16). Least squares with forgetting (`forget` per
    sample) over measured (forwards, rows, seconds); `prior_s` per forward until measured. While
    the rows per forward have not varied, the per-forward term takes all of the time."""

    def __init__(self, prior_s: float = 0.0, forget: float = 0.9) -> None:
        self.a, self.b = prior_s, 0.0
        self.forget = forget
        self._xx = np.zeros((2, 2))  # forgotten sums of x x^T, x = (forwards, rows)
        self._xy = np.zeros(2)

    def __call__(self, forwards: int, rows: int) -> float:
        return self.a * forwards + self.b * rows

    def update(self, forwards: int, rows: int, seconds: float) -> None:
        """One measured sample. A time SPIKE times below the fit's estimate starts the fit over
        from it: the machine can slow work down, not speed it up, so the estimate held a spike
        (or the work got cheaper); a spike itself is fitted in full, and the sample after it
        undoes it (adaptive k asks for that sample when it stops drafting: `_draft_probe`)."""
        if forwards <= 0:
            return
        if self._xx[0, 0] > 0.0 and self(forwards, rows) > SPIKE * seconds:
            self._xx, self._xy = np.zeros((2, 2)), np.zeros(2)
        x = np.array([forwards, rows], dtype=float)
        self._xx = self.forget * self._xx + np.outer(x, x)
        self._xy = self.forget * self._xy + x * seconds
        ridge = np.diag([0.0, 1e-3 * self._xx[1, 1]])  # a direction the samples leave open goes to b = 0
        a, b = np.linalg.lstsq(self._xx + ridge, self._xy, rcond=None)[0]
        if b < 0:
            a, b = self._xy[0] / self._xx[0, 0], 0.0
        elif a < 0:
            a, b = 0.0, self._xy[1] / self._xx[1, 1]
        self.a, self.b = float(a), float(b)


class MovingAverage:
    """Exponential moving average of a measured duration; `value` is the prior until measured.
    With `restarts`, a sample SPIKE times below the average starts it over (as `WorkCost`)."""

    def __init__(self, prior: float, weight: float = 0.1, restarts: bool = False) -> None:
        self.value, self.weight, self.count, self.restarts = prior, weight, 0, restarts

    def update(self, x: float) -> None:
        if self.restarts and self.count and self.value > SPIKE * x:
            self.count = 0
        w = max(self.weight, 1.0 / (self.count + 1))  # the first samples count fully
        self.value += w * (x - self.value)
        self.count += 1
