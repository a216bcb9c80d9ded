"""Per-request acceptance by draft slot, smoothed with a Beta prior.

alpha_i = P(slot i accepted | slots < i accepted), estimated from the request's own verify
outcomes as (prior_accept + accepted_i) / (prior_accept + prior_reject + reached_i). The prior is
optimistic (mean 0.8) but weak, so a new request speculates while a few rejections bring it
down. Counts decay on every outcome (recent steps weigh most) and, while the request does not
speculate, decay further every step so it probes again now and then instead of staying at k = 0
for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.core import count_by_position


@dataclass
class _Counts:
    accepted: list[float] = field(default_factory=list)  # [slots] decayed accepts at slot i
    reached: list[float] = field(default_factory=list)  # [slots] decayed times slot i was verified


class AcceptanceTracker:
    def __init__(self, prior_accept: float = 0.8, prior_reject: float = 0.2, decay: float = 0.95, idle_decay: float = 0.99) -> None:
        self.prior_accept, self.prior_reject = prior_accept, prior_reject
        self.decay, self.idle_decay = decay, idle_decay
        self._counts: dict[str, _Counts] = {}

    def alphas(self, request_id: str, k: int) -> list[float]:
        """[k] smoothed conditional acceptance of slots 0..k-1."""
        c = self._counts.get(request_id, _Counts())
        prior = self.prior_accept + self.prior_reject
        return [
            (self.prior_accept + (c.accepted[i] if i < len(c.accepted) else 0.0))
            / (prior + (c.reached[i] if i < len(c.reached) else 0.0))
            for i in range(k)
        ]

    def record(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """One verify: slots 0..num_accepted were reached, the first num_accepted accepted."""
        c = self._counts.setdefault(request_id, _Counts())
        _scale(c, self.decay)
        count_by_position(c.reached, c.accepted, min(num_drafts, num_accepted + 1), num_accepted)

    def idle(self, request_id: str) -> None:
        """A decode step where the request did not speculate: its evidence fades toward the prior."""
        c = self._counts.get(request_id)
        if c is not None:
            _scale(c, self.idle_decay)

    def release(self, request_id: str) -> None:
        self._counts.pop(request_id, None)


def _scale(c: _Counts, factor: float) -> None:
    c.accepted = [a * factor for a in c.accepted]
    c.reached = [r * factor for r in c.reached]
