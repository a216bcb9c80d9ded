"""Cost-aware speculation length: each decode step, every request's k (0 = plain decoding) is
chosen to maximise the batch's expected emitted tokens per second.

Acceptance comes from the request's own verify outcomes (`AcceptanceTracker`), the cost of a step
from a linear model of the target's verify time (`StepCostModel`, fitted online from measured
step times) plus the proposer's measured draft cost. The k chooser itself is pure
(`k_chooser.choose_k`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from speculant.core import Request, StepResult
from speculant.speculative.acceptance_tracker import AcceptanceTracker
from speculant.speculative.cost_model import MovingAverage, StepCostModel
from speculant.speculative.k_chooser import choose_k


class AdaptiveK:
    def __init__(self, draft_forwards: Callable[[Sequence[int]], int], draft_forward_prior_s: float = 0.0) -> None:
        self.draft_forwards = draft_forwards  # draft-model forwards a step with these k's runs while proposing
        self.tracker = AcceptanceTracker()
        self.cost = StepCostModel()
        self.draft_forward_s = MovingAverage(draft_forward_prior_s)
        self._context = None  # context tokens of the decode step being taken; None: not a decode step
        self._draft_s = 0.0  # seconds this step spent proposing

    def choose(self, requests: Sequence[Request], k_max: Sequence[int]) -> list[int]:
        context = sum(r.num_computed_tokens for r in requests)
        alphas = [self.tracker.alphas(r.request_id, k) for r, k in zip(requests, k_max)]
        self._context, self._draft_s = context, 0.0
        return choose_k(alphas, k_max, lambda ks: self.step_seconds(ks, context))

    def step_seconds(self, ks: Sequence[int], context: int) -> float:
        return self.cost.predict(ks, context) + self.draft_forward_s.value * self.draft_forwards(ks)

    def not_decoding(self) -> None:
        self._context = None

    def record_draft_time(self, seconds: float, forwards: int) -> None:
        """The proposer spent `seconds` proposing with `forwards` draft-model forwards."""
        self._draft_s += seconds
        if forwards > 0:
            self.draft_forward_s.update(seconds / forwards)

    def observe(self, result: StepResult, seconds: float) -> None:
        """A committed decode step took `seconds`: update acceptance and the target's cost fit."""
        if self._context is None:
            return
        offsets = result.row_offsets
        ks = [offsets[b + 1] - offsets[b] - 1 for b in range(len(result.requests))]
        accepted = result.accepted_counts if result.speculative else [0] * len(ks)
        for r, k, a in zip(result.requests, ks, accepted):
            if r.finished:
                continue
            if k > 0:
                self.tracker.record(r.request_id, k, a)
            else:
                self.tracker.idle(r.request_id)
        self.cost.update(ks, self._context, max(0.0, seconds - self._draft_s))
        self._context = None

    def release(self, request: Request) -> None:
        self.tracker.release(request.request_id)
