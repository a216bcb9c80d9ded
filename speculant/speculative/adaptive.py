"""Cost-aware speculation length: each decode step, every request's k (0 = plain decoding) is
chosen to maximise the batch's expected emitted tokens per second.

Acceptance comes from verify outcomes of the request and of drafts of the same kind
(`AcceptanceTracker`; the proposer offers its drafts with a key, e.g. an n-gram match's length),
read at their posterior mean, except for one request per step, drawn at random, read at a
posterior quantile drawn for it (z ~ N(0, 1)) and allowed at most one draft more than the mean
would give it: low estimates are probed again, a probe teaches the one slot past
what is already verified, and it costs at most one draft and one verify row however large the
batch (a Thompson draw over every slot at once made thin far slots look good and, at batch 1,
probed k = 5-6 where k = 2 was best). A draw that would draft less than the mean's choice is not
taken: fewer drafts verify only slots the mean's choice verifies too, so they teach nothing and
cost tokens (at batch 1 the one request is the explorer every step, and low draws turned steps of
a chat answer at k = 1-2 into plain ones); so a draw below the mean (z <= 0) is not even priced,
which halves the explorer's share of the plan (a second pass of the chooser). The explorer
probes acceptance; what a draft costs is learnt only from steps that draft it, so after
DRAFT_PROBE_EVERY plans at one choice of the mean's where the explorer drafted no more it
drafts one more anyway (`_draft_probe`: one slow sample cannot price drafting out for good). The cost
of a step comes from a model of the target's verify time by row count with a speculative step's
fixed overhead (`StepCostModel`, calibrated at start-up and fitted online from measured step
times), plus the proposer's measured time, each fitted by forwards and rows (`WorkCost`): its
forwards while proposing (by the rows each carries), its refill after a step (by the requests
fed), and a lazily fed draft's backlog (its share of the catch-up, see `_with_catch_up`). The k
chooser itself is pure (`k_chooser.choose_k`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from speculant.core import Request, StepResult
from speculant.speculative.acceptance_tracker import AcceptanceTracker
from speculant.speculative.calibration import Sample
from speculant.speculative.cost_model import MovingAverage, StepCostModel, WorkCost
from speculant.speculative.k_chooser import choose_k, expected_tokens_by_k

PLAN_SHARE = 0.05  # while plans draft nothing, planning runs only as often as keeps its time under this share of a token's
REST_MAX = 16  # unplanned steps in a row at most
MARGIN = 0.05  # predicted gain over plain decoding needed to speculate (the model's typical error)
CATCH_UP_MIN = 16  # a backlog past this many tokens is priced (a shorter one is part of the feed's cost)
CATCH_UP_RISK = 2.0  # a catch-up is paid now and won back only if the answer runs to max_tokens and the estimates hold
PLAIN_PROBE_EVERY = 32  # a plan that drafts, after this many fitted steps without a plain one, is taken plain (a cost probe)
DRAFT_PROBE_EVERY = 64  # after this many plans at one choice whose explorer drafted no more, it drafts one more (a cost probe)


class AdaptiveK:
    def __init__(
        self, draft_work: Callable[[Sequence[int]], tuple[int, int]], draft_forward_prior_s: float = 0.0,
        fed: Callable[[Sequence[int]], int] | None = None,
    ) -> None:
        self.draft_work = draft_work  # (draft forwards, rows over them) a step with these k's runs while proposing
        self.fed = fed  # requests a step with these k's refills the proposer for (`Proposer.fed_requests`; None: every one)
        self.tracker = AcceptanceTracker()
        self.rng = np.random.default_rng(0)  # each step's explorer and its quantile (k's only; tokens never depend on them)
        self.cost = StepCostModel()
        self.draft_cost = WorkCost(draft_forward_prior_s)  # proposing: by forwards and rows
        self.feed_cost = WorkCost(0.0)  # following a step's tokens (a draft's KV refill): one forward, by requests fed
        self.catch_up_s = MovingAverage(0.0, restarts=True)  # seconds per backlog token caught up (0 until measured: the first one is tried)
        self._context = None  # context tokens of the decode step being taken; None: not a decode step
        self._keys: dict[str, Hashable] = {}  # request id -> key of the drafts on offer this step (offered only)
        self._draft_s = 0.0  # seconds this step spent in the proposer (proposing, refilling)
        self.plan_s = MovingAverage(0.0)  # host seconds a planned decode step spends choosing k's and learning from them
        self.step_s = MovingAverage(0.0)  # seconds of a planned decode step
        self._plan_now = 0.0  # this step's planning seconds so far
        self._rest = 0  # decode steps left to take unplanned (every k 0)
        self.measured_context = 0  # the longest context per sequence the cost model has measured a step at
        self._since_plain = 0  # fitted decode steps since the last plain one (the calibration counts as one)
        self._resting_now = False  # the decode step being taken is unplanned (`resting`)
        self._unprobed: dict[int, int] = {}  # the mean's k -> plans at it since the explorer last drafted one more

    def plan(
        self, requests: Sequence[Request], offer: Callable[[Request], tuple[int, Hashable]], backlog: Callable[[Request], int],
    ) -> list[int]:
        """Each request's k this decode step: all 0 while planning rests (`resting`: a plain step,
        unplanned), else chosen (`choose`) from the proposer's `offer` (drafts at most, their
        kind) and `backlog` per request, the planning's time recorded."""
        if self.resting(requests):
            return [0] * len(requests)
        start = time.perf_counter()
        offers = [offer(r) for r in requests]
        backlogs = [backlog(r) for r in requests]
        ks = self.choose(requests, [n for n, _ in offers], [key for _, key in offers], backlogs)
        self.record_plan_time(time.perf_counter() - start)
        return ks

    def use_calibration(self, samples: Sequence[Sample]) -> None:
        """Seed the step cost model from start-up samples (`speculative.calibration`); none: the prior stays."""
        if samples:
            self.cost = StepCostModel.calibrated(samples)
            self.measured_context = max(context // len(ks) for ks, context, _ in samples)

    def stats(self) -> dict:
        """The step cost fit's coefficients and its calibration, for `LLM.stats()`."""
        return {"step_cost_coefficients_s": [float(c) for c in self.cost.theta], "step_cost_calibration": self.cost.calibration}

    def choose(
        self, requests: Sequence[Request], k_max: Sequence[int], keys: Sequence[Hashable] | None = None, backlog: Sequence[int] | None = None,
    ) -> list[int]:
        """Each request's k this step; k_max[b]: drafts on offer (0: none), keys[b]: their kind,
        backlog[b]: tokens the proposer must catch up before drafting for it."""
        keys = [None] * len(requests) if keys is None else keys
        context = sum(r.num_computed_tokens for r in requests)
        if backlog is not None:
            k_max = self._catch_up_after_measuring(requests, k_max, backlog)
        alphas = self.tracker.draws([(r.request_id, k, key, 0.0) for r, k, key in zip(requests, k_max, keys)])
        backlog, cost = backlog or [0] * len(requests), self.cost_of(context, len(requests))
        ks = choose_k(alphas, k_max, self._with_catch_up(cost, requests, alphas, k_max, backlog), MARGIN)
        offering = [b for b, k in enumerate(k_max) if k > 0]  # a request with nothing on offer learns nothing
        if offering:  # the explorer: a posterior draw, at most one draft past its choice at the mean
            b = offering[int(self.rng.integers(len(offering)))]
            z = float(self.rng.standard_normal())
            mean_k = ks[b]
            if mean_k < k_max[b] and z > 0.0:  # at its cap, no probe drafts more; a draw below the mean asks for fewer
                alphas[b] = self.tracker.draw(requests[b].request_id, k_max[b], keys[b], z)
                caps = list(k_max)
                caps[b] = mean_k + 1
                probe = choose_k(alphas, caps, self._with_catch_up(cost, requests, alphas, caps, backlog), MARGIN)
                if probe[b] > mean_k:  # a low draw is not taken: fewer drafts teach nothing the mean's choice does not
                    ks = probe
        if any(ks) and self._since_plain >= PLAIN_PROBE_EVERY:
            ks = [0] * len(ks)  # a cost probe (`observe`)
        elif offering and mean_k < k_max[b]:
            ks = self._draft_probe(ks, b, mean_k)
        self._context, self._draft_s = context, 0.0
        self._keys = {r.request_id: key for r, k, key in zip(requests, k_max, keys) if k > 0}
        return ks

    def _draft_probe(self, ks: list[int], b: int, mean_k: int) -> list[int]:
        """The explorer's k, one draft past the mean's choice after DRAFT_PROBE_EVERY plans at
        that choice where it drafted no more. What a draft costs is learnt only from steps that
        draft it (the proposer's forwards and refill, a lazy head's catch-up, the overhead and
        the knot of that row count), and the explorer probes acceptance, not cost: one slow
        refill timed during a warm-up (a 100 ms head forward against 3 ms) once priced every
        draft out, and adaptive MTP took 4,806 plain steps in a row over 80 prompts where k = 1
        paid in math. Counted by the mean's choice, so that probes from k = 0 to 1 do not stand
        for the second draft's cost. A probe is one draft and one verify row every
        DRAFT_PROBE_EVERY steps at most."""
        count = self._unprobed.get(mean_k, 0)
        if ks[b] == mean_k and count >= DRAFT_PROBE_EVERY:
            ks = list(ks)
            ks[b] = mean_k + 1
        self._unprobed[mean_k] = 0 if ks[b] > mean_k else count + 1  # a drawn or forced probe restarts the count
        return ks

    def cost_of(self, context: int, num_seqs: int) -> Callable[[Sequence[int]], float]:
        """Per-request k's of num_seqs sequences -> predicted seconds of this step (target and draft)."""
        target, draft, feed = self.cost.curve(context, num_seqs), self.draft_cost, self.feed_cost

        def cost(ks: list[int]) -> float:
            fed = len(ks) if self.fed is None else self.fed(ks)
            return target(sum(ks) + len(ks)) + draft(*self.draft_work(ks)) + (feed(1, fed) if fed else 0.0)

        return cost

    def _catch_up_after_measuring(self, requests: Sequence[Request], k_max: Sequence[int], backlog: Sequence[int]) -> list[int]:
        """No catch-up for a request longer than any context the cost model has measured a step
        at (by more than CATCH_UP_MIN): its plain step there comes first. A catch-up is paid once
        and priced against the steps it would speed up; priced from the calibration's longest
        point (512 tokens), the qwen pair's plain step at a 1,307-token document was predicted at
        476 ms where it took 180-200, so the catch-up looked cheap beside it and the answer ran at
        0.90x of plain decoding. One plain step at that context corrects the fit."""
        limit = self.measured_context + CATCH_UP_MIN
        return [0 if n > CATCH_UP_MIN and r.num_computed_tokens > limit else k for r, k, n in zip(requests, k_max, backlog)]

    def _with_catch_up(
        self, cost: Callable, requests: Sequence[Request], alphas: list[list[float]], k_max: Sequence[int], backlog: Sequence[int],
    ) -> Callable:
        """A backlog is caught up once, then the request drafts for the rest of its output: a
        step is charged the share of the catch-up that its expected tokens are of the request's
        remaining ones, so speculation starts when what it wins per token pays for it (a long
        prompt and a short answer: it does not; `alphas` as they are now, the explorer's included).
        The catch-up counts CATCH_UP_RISK times over: it is certain, its return is not (the answer
        may stop before max_tokens, the acceptance may not hold). Each request's charge by k is
        tabled once: the chooser prices a step once per draft it considers (~200 at batch 32)."""
        per_token = self.catch_up_s.value * CATCH_UP_RISK
        due = []  # (request index, [k_max + 1] its charge by k; none at k = 0)
        for b, (r, n) in enumerate(zip(requests, backlog)):
            if n > CATCH_UP_MIN and per_token > 0.0:
                share = per_token * n / max(1, r.params.max_tokens - len(r.output_token_ids))
                due.append((b, [0.0] + [share * e for e in expected_tokens_by_k(alphas[b], k_max[b])[1:]]))
        if not due:
            return cost

        def with_catch_up(ks: list[int]) -> float:
            return cost(ks) + sum(charge[ks[b]] for b, charge in due)

        return with_catch_up

    def not_decoding(self) -> None:
        self._context, self._resting_now = None, False

    def resting(self, requests: Sequence[Request]) -> bool:
        """Whether this decode step of `requests` is taken unplanned, as a
        plain step: no lookups, no choice, nothing learnt about acceptance; only its time is
        fitted (`observe`: a plain step's cost then follows the machine and the context, where
        most steps rest). Planning costs host time on every step whatever it decides (at
        batch 16 and 32 ~1-2% of a plain step: each request's lookup, the chooser, the fits).
        While plans draft nothing, what the next plan can win is about one token (a request's
        draft accepted), worth a plain step's time over its sequences; so plans run only as
        often as keeps their time under PLAN_SHARE of that (0.9 ms of planning a 50 ms step of
        16 sequences: one step in 6). At batch 1 a token is a whole step and every step plans
        (an earlier budget, a share of the step, rested 5 steps after each empty plan at batch 1
        and cut adaptive n-gram there from 1.69x to 1.55x on code). Acceptance fades per planned
        step, so the explorer comes back as before, in fewer steps' time."""
        if self._rest <= 0:
            return False
        self._rest -= 1
        self._context, self._draft_s, self._resting_now = sum(r.num_computed_tokens for r in requests), 0.0, True
        return True

    def record_plan_time(self, seconds: float) -> None:
        self._plan_now = seconds

    def record_draft_time(self, seconds: float, work: tuple[int, int]) -> None:
        """The proposer spent `seconds` proposing with `work` = (draft forwards, their rows)."""
        self._draft_s += seconds
        self.draft_cost.update(*work, seconds)

    def record_feed_time(self, seconds: float, requests: int) -> None:
        """The proposer spent `seconds` following the step's tokens of `requests` requests (every
        decode step pays it, or with a lazy feed every step that drafts; no part of the target's cost)."""
        if self._context is not None:
            self._draft_s += seconds
            self.feed_cost.update(1, requests, seconds)

    def record_catch_up(self, seconds: float, tokens: int, requests: int) -> None:
        """The proposer caught up a backlog of `tokens` in `seconds`: a few steps' worth is part
        of the feed's cost, a longer one (a prompt) sets the price per token of catching up."""
        if tokens <= CATCH_UP_MIN:
            self.record_feed_time(seconds, requests)
            return
        if self._context is not None:
            self._draft_s += seconds
        self.catch_up_s.update(seconds / tokens)

    def observe(self, result: StepResult, seconds: float) -> None:
        """A committed decode step took `seconds`: update acceptance and the target's cost fit.
        A request with nothing on offer (no n-gram match) leaves its evidence as it is. Every
        step is fitted, a slow one only so far (`StepCostModel.update`). A first step at a row
        count not run before was once priced apart as one-off set-up and charged to every row
        count not run yet; at batch 1 the charge (98 ms, the fit's error at two row counts) held
        the qwen pair at k = 1 for 239 of 265 drafting steps, 0.83-0.87 of the best fixed k, and
        was never revised, since no other row count ran.

        A fit that sees only drafting steps cannot tell what a plain step costs: every drafting
        step at batch 16 verified 24 rows with the overhead on, so the 24-row knot and the
        overhead moved as one, and the plain 16-row knot drifted up with the level they share
        (adaptive n-gram on math at batch 16: plain steps priced at 80 ms where they took 68, a
        step with 8 drafts 1 ms above one without, and 0.967x of plain decoding's throughput).
        So after PLAIN_PROBE_EVERY fitted steps without a plain one, a plan that drafts is taken
        plain instead (`choose`): at most one step's gain in 33 where drafting pays."""
        if self._context is None:
            return
        start = time.perf_counter()
        self.measured_context = max(self.measured_context, max((r.num_computed_tokens for r in result.requests), default=0))
        offsets = result.row_offsets
        ks = [offsets[b + 1] - offsets[b] - 1 for b in range(len(result.requests))]
        self.cost.update(ks, self._context, max(0.0, seconds - self._draft_s))
        self._since_plain = self._since_plain + 1 if any(ks) else 0
        self._context = None
        if self._resting_now:  # unplanned: its time is all it teaches
            self._resting_now = False
            return
        accepted = result.accepted_counts if result.speculative else [0] * len(ks)
        any_idle = False
        for r, k, a in zip(result.requests, ks, accepted):
            if r.finished or r.request_id not in self._keys:
                continue
            if k > 0:
                self.tracker.record(r.request_id, k, a, self._keys[r.request_id])
            else:
                self.tracker.idle(r.request_id)
                any_idle = True
        if any_idle:
            self.tracker.idle_step()
        self.plan_s.update(self._plan_now + time.perf_counter() - start)
        self.step_s.update(seconds)
        token_s = self.step_s.value / max(1, len(ks))  # what one token of a plain step costs
        share = self.plan_s.value / max(1e-12, PLAN_SHARE * token_s)  # planning's time in units of its budget
        self._rest = 0 if any(ks) else max(0, min(REST_MAX, math.ceil(share) - 1))

    def release(self, request: Request) -> None:
        self.tracker.release(request.request_id)
