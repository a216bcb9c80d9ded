"""A linear cost model of one decode step, fitted online from the engine's step timings.

    t(step) = a + b * (tokens verified in the batch, sum of k_b + 1) + c * (context tokens / 1000)
              + draft cost (the proposer's own measured seconds per draft forward x forwards)

The target part is fitted by recursive least squares forgetting old steps (factor 0.98: about
the last 50 decode steps count), starting from a prior (10 ms a step, a verified token costing a
tenth of that) that the first measured steps quickly outweigh; the draft part is a moving average the proposer measures
around its own draft forwards. Pure arithmetic: no engine, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PRIOR = (0.01, 0.001, 0.0)  # seconds: per step, per verified token, per 1000 context tokens


def features(ks: Sequence[int], context_tokens: int) -> np.ndarray:
    """[3] the regressors of a decode step whose sequences verify k_b + 1 tokens each."""
    return np.array([1.0, float(sum(k + 1 for k in ks)), context_tokens / 1000.0])


class StepCostModel:
    def __init__(self, prior: Sequence[float] = PRIOR, noise_s: float = 1e-3, forget: float = 0.98) -> None:
        self.theta = np.array(prior, dtype=float)  # [3] a, b, c
        scale = np.maximum(np.abs(self.theta), 1e-3)  # prior std of each coefficient
        self.P = np.diag((scale / noise_s) ** 2)  # [3, 3] covariance of theta over the timing noise
        self._P_trace_max = float(np.trace(self.P)) * 1e3  # no wind-up while the regressors do not vary
        self.forget = forget
        self.num_updates = 0
        self.calibration: list[tuple[list[int], int, float]] = []  # the samples the prior was fitted to

    @classmethod
    def calibrated(cls, samples: Sequence[tuple[Sequence[int], int, float]]) -> StepCostModel:
        """A model whose prior is the least-squares fit of measured (ks, context, seconds)
        samples (`speculative.calibration`); the prior's weight is that of a few steps."""
        x = np.stack([features(ks, context) for ks, context, _ in samples])  # [S, 3]
        y = np.array([seconds for _, _, seconds in samples])
        theta = np.linalg.lstsq(x, y, rcond=None)[0]
        model = cls(prior=np.concatenate([theta[:1], np.maximum(theta[1:], 0.0)]))
        model.calibration = [(list(ks), int(c), float(s)) for ks, c, s in samples]
        return model

    def predict(self, ks: Sequence[int], context_tokens: int) -> float:
        """Seconds for the target's part of a decode step (never below a microsecond)."""
        theta = np.concatenate([self.theta[:1], np.maximum(self.theta[1:], 0.0)])  # more tokens never cost less
        return max(1e-6, float(features(ks, context_tokens) @ theta))

    def update(self, ks: Sequence[int], context_tokens: int, seconds: float) -> None:
        """One recursive-least-squares step towards a measured step time."""
        x = features(ks, context_tokens)
        Px = self.P @ x
        gain = Px / (self.forget + x @ Px)
        self.theta = self.theta + gain * (seconds - x @ self.theta)
        self.P = (self.P - np.outer(gain, Px)) / self.forget
        trace = float(np.trace(self.P))
        if trace > self._P_trace_max:
            self.P *= self._P_trace_max / trace
        self.num_updates += 1

    def fit(self, samples: Sequence[tuple[Sequence[int], int, float]]) -> None:
        """Feed (ks, context tokens, seconds) samples in order."""
        for ks, context, seconds in samples:
            self.update(ks, context, seconds)


class MovingAverage:
    """Exponential moving average of a measured duration; `value` is the prior until measured."""

    def __init__(self, prior: float, weight: float = 0.1) -> None:
        self.value, self.weight, self.count = prior, weight, 0

    def update(self, x: float) -> None:
        w = max(self.weight, 1.0 / (self.count + 1))  # the first samples count fully
        self.value += w * (x - self.value)
        self.count += 1
