"""Acceptance by draft slot, per request and per kind of draft, smoothed toward pooled evidence.

alpha_i = P(slot i accepted | slots < i accepted). Outcomes are counted under a key that the
proposer gives each draft (an n-gram proposer: the length of the suffix that matched; a draft
model: none), for the request alone, pooled per key over every request, and pooled over all keys.
Each level shrinks toward the one above it, with strength s = prior_accept + prior_reject, and a
request toward its kind's pooled estimate with strength w (`pooled_weight`, 4: a few early
rejections of one request do not outweigh what hundreds of its kind's drafts showed):

    all_0              = (s * prior mean + accepted_0) / (s + reached_0)
    all_i              = (c * all_{i-1} + accepted_i) / (c + reached_i)          (i > 0)
    pooled_i(key)      = (s * all_i + pooled accepted_i) / (s + pooled reached_i)   (all_i if key is the only kind)
    alpha_i(req, key)  = (w * pooled_i(key) + accepted_i) / (w + reached_i)

A slot past the first is verified only when the slots before it were accepted and k reached it,
so its evidence is thin where adaptive k keeps k small: it leans on the slot before it with
strength c (`chain_weight`, 4), and a kind that is the only kind so far (a draft model's) is not
counted a second time as its own pool (one rejection at slot 1 counted at three levels once read
as 0.14 and held k at 1 for the rest of an answer).

So a new request starts from what drafts of its kind have been worth lately, a new kind from what
all drafts have, and a slot no draft has reached yet from the slot before it (at first the
optimistic but weak Beta(0.8, 0.2) prior); a request's own outcomes take over within a few steps.
Counts decay on every outcome (recent steps weigh most). While a request does not speculate, its
own and the pooled evidence fade further, so speculation is probed again now and then instead of
staying at k = 0 for good.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from speculant.core import count_by_position


@dataclass
class _Counts:
    accepted: list[float] = field(default_factory=list)  # [slots] decayed accepts at slot i
    reached: list[float] = field(default_factory=list)  # [slots] decayed times slot i was verified

    def scale(self, factor: float) -> None:
        self.accepted = [a * factor for a in self.accepted]
        self.reached = [r * factor for r in self.reached]

    def rate(self, i: int, prior_accept: float, prior_total: float) -> float:
        """(prior_accept + accepted_i) / (prior_total + reached_i)."""
        a, total = self.evidence(i, prior_accept, prior_total)
        return a / total

    def evidence(self, i: int, prior_accept: float, prior_total: float) -> tuple[float, float]:
        """(prior_accept + accepted_i, prior_total + reached_i)."""
        if i >= len(self.reached):
            return prior_accept, prior_total
        return prior_accept + self.accepted[i], prior_total + self.reached[i]


class AcceptanceTracker:
    def __init__(
        self,
        prior_accept: float = 0.8,
        prior_reject: float = 0.2,
        decay: float = 0.95,
        idle_decay: float = 0.9,
        pooled_decay: float = 0.995,
        pooled_idle_decay: float = 0.98,
        pooled_weight: float = 4.0,
        chain_weight: float = 4.0,
    ) -> None:
        self.prior_accept, self.prior_reject = prior_accept, prior_reject
        self.decay, self.idle_decay = decay, idle_decay
        self.pooled_decay, self.pooled_idle_decay = pooled_decay, pooled_idle_decay
        self.pooled_weight = pooled_weight  # a request's own outcomes the pooled estimate counts as
        self.chain_weight = chain_weight  # outcomes at slot i the slot before's estimate counts as (every kind, i > 0)
        self._counts: dict[str, dict[Hashable, _Counts]] = {}  # request id -> key -> its own outcomes
        self._pooled: dict[Hashable, _Counts] = {}  # key -> every request's outcomes
        self._all = _Counts()  # every request's outcomes, whatever their key

    def alphas(self, request_id: str, k: int, key: Hashable = None) -> list[float]:
        """[k] smoothed conditional acceptance of slots 0..k-1 for a draft of this key (the
        posterior mean)."""
        return self.draw(request_id, k, key, 0.0)

    def draw(self, request_id: str, k: int, key: Hashable, z: float) -> list[float]:
        """[k] each slot's acceptance at z posterior standard deviations from its mean."""
        return self.draws([(request_id, k, key, z)])[0]

    def draws(self, rows: Sequence[tuple[str, int, Hashable, float]]) -> list[list[float]]:
        """For each (request id, k, key, z): [k] each slot's acceptance at z standard deviations
        from the mean of the request's Beta posterior (its prior the pooled mean), clipped to
        [0, 1]. z = 0 is the mean; a z drawn from N(0, 1) is a Thompson draw: a request whose
        evidence is thin, or has faded while it did not speculate, now and then looks good enough
        to try drafts again, and how often depends on what drafts of its kind are worth. The
        every-kind level is the same for every row, so it is computed once."""
        s, w = self.prior_accept + self.prior_reject, self.pooled_weight
        every_kind, above = [], self.prior_accept / s
        for i in range(max((k for _, k, _, _ in rows), default=0)):
            strength = s if i == 0 else self.chain_weight
            above = self._all.rate(i, strength * above, strength)  # all keys: the slot before is the prior
            every_kind.append(above)
        one_kind = len(self._pooled) <= 1  # every draft so far of one kind: its pooled evidence is every kind's
        out = []
        for request_id, k, key, z in rows:
            pooled = self._pooled.get(key, _Counts())
            own = self._counts.get(request_id, {}).get(key, _Counts())
            slots = []
            for i in range(k):
                kind = every_kind[i] if one_kind else pooled.rate(i, s * every_kind[i], s)
                a, n = own.evidence(i, w * kind, w)
                mean = a / n
                slots.append(min(1.0, max(0.0, mean + z * (mean * (1.0 - mean) / (n + 1.0)) ** 0.5)))
            out.append(slots)
        return out

    def record(self, request_id: str, num_drafts: int, num_accepted: int, key: Hashable = None) -> None:
        """One verify: slots 0..num_accepted were reached, the first num_accepted accepted."""
        num_reached = min(num_drafts, num_accepted + 1)
        own = self._counts.setdefault(request_id, {}).setdefault(key, _Counts())
        pooled = self._pooled.setdefault(key, _Counts())
        own.scale(self.decay)
        pooled.scale(self.pooled_decay)
        self._all.scale(self.pooled_decay)
        for c in (own, pooled, self._all):
            count_by_position(c.reached, c.accepted, num_reached, num_accepted)

    def idle(self, request_id: str) -> None:
        """A decode step where the request could have speculated and did not: its evidence fades
        toward the pooled estimate."""
        for c in self._counts.get(request_id, {}).values():
            c.scale(self.idle_decay)

    def idle_step(self) -> None:
        """A decode step where some request could have speculated and did not: the pooled
        evidence fades toward the prior (once per step, whatever the batch size)."""
        for c in (*self._pooled.values(), self._all):
            c.scale(self.pooled_idle_decay)

    def release(self, request_id: str) -> None:
        self._counts.pop(request_id, None)
