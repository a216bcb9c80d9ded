"""Adaptive speculation length through the engine: outputs stay exactly the target's, and the
per-request k choices are counted."""

from __future__ import annotations

import argparse
import itertools

import pytest
from testkit import TinyCheckpoint, greedy_params, tiny_hf_model, tiny_llm

from speculant import LLM
from speculant.config_options import add_engine_arguments, engine_config_from_args
from speculant.speculative.cost_model import KNOTS

GREEDY = greedy_params()
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], [9, 9, 9, 9, 9, 9], list(range(100, 117)), [7, 1, 7, 1, 7, 1]]


def check_stats(stats: dict, k_max: int) -> None:
    histogram = stats["chosen_k_histogram"]
    assert histogram and all(0 <= k <= k_max for k in histogram)
    assert 0 <= stats["mean_chosen_k"] <= k_max


@pytest.mark.parametrize("batch_size", [1, 6])
def test_draft_target_greedy_equals_plain(target, plain_outputs, batch_size):
    draft = tiny_hf_model("llama", seed=5, num_hidden_layers=1)
    llm = tiny_llm(target, draft, num_draft_tokens=5, adaptive_k=True)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    check_stats(llm.stats(), 5)
    assert llm.stats()["kv_pages_used"] == 0


def test_target_as_own_draft_stays_lossless_and_has_every_draft_accepted(target, plain_outputs):
    llm = tiny_llm(target, target, num_draft_tokens=3, adaptive_k=True)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    stats = llm.stats()
    assert stats["accepted_tokens"] == stats["draft_tokens"]  # whatever k was chosen (0 too), every draft was right
    check_stats(stats, 3)


@pytest.mark.parametrize("batch_size", [1, 6])
def test_ngram_greedy_equals_plain(target, plain_outputs, batch_size):
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=4, adaptive_k=True)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    check_stats(llm.stats(), 4)


def test_ngram_preemption_releases_tracker_state(target, plain_outputs):
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=3, num_pages=16, adaptive_k=True)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    assert llm.stats()["preemptions"] > 0
    assert llm.engine.proposer.adaptive.tracker._counts == {}


def test_adaptive_k_is_the_default(target):
    llm = LLM(model="tiny", checkpoint=TinyCheckpoint(target), speculative="ngram", page_size=4, num_pages=64)
    assert llm.engine.proposer.adaptive is not None


def test_without_adaptive_k_every_request_gets_the_configured_k(target):
    llm = tiny_llm(target, speculative="ngram", num_draft_tokens=4, adaptive_k=False)
    llm.generate(PROMPTS[:1], GREEDY)
    histogram = llm.stats()["chosen_k_histogram"]
    # fewer only on the last steps, where max_tokens leaves fewer than 4 tokens after the bonus
    # (3, 2, 1, 0: each step takes one at least)
    assert max(histogram) == 4 and sum(n for k, n in histogram.items() if k < 4) <= 4, histogram
    assert llm.engine.proposer.adaptive is None


def test_cli_flags():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--adaptive-k"])).speculative.adaptive_k is True
    assert engine_config_from_args(parser.parse_args(["--no-adaptive-k"])).speculative.adaptive_k is False


def test_the_explorer_is_drawn_among_requests_with_drafts_on_offer(monkeypatch):
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    probed = []  # request ids read away from their mean
    monkeypatch.setattr(
        adaptive.tracker, "draws", lambda rows: probed.extend(i for i, _, _, z in rows if z != 0.0) or [[0.5] * k for _, k, _, _ in rows]
    )
    requests = [SimpleNamespace(request_id=str(b), num_computed_tokens=10) for b in range(4)]
    for _ in range(20):
        adaptive.choose(requests, [0, 3, 0, 3])
    assert set(probed) == {"1", "3"}  # nothing on offer: read at the mean, never probed
    probed.clear()
    adaptive.choose(requests, [0, 0, 0, 0])
    assert probed == []


def test_a_probe_takes_at_most_one_draft_past_the_choice_at_the_mean():
    """Thin evidence at far slots must not make the explorer draft to k_max: it may try the one
    slot past what the posterior mean chooses (here k = 2 of 6), so a probe costs one draft; and
    a low draw never drafts less than the mean's choice (that teaches nothing and costs tokens:
    at batch 1 the one request is the explorer every step)."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (max(ks, default=0), sum(ks)))
    adaptive.draft_cost.a = 0.02  # a draft forward costs a fifth of a target step
    adaptive.cost.theta[:] = 0.0
    adaptive.cost.theta[: len(KNOTS)] = 0.1  # the target: 100 ms whatever its rows
    request = SimpleNamespace(request_id="r", num_computed_tokens=10)
    for _ in range(30):  # slot 0 always right, slot 1 half the time; later slots never reached
        adaptive.tracker.record("r", 2, 2)
        adaptive.tracker.record("r", 2, 1)
    chosen = {adaptive.choose([request], [6])[0] for _ in range(200)}
    assert chosen == {2, 3}


@pytest.mark.parametrize("batch_size", [1, 6])
def test_draft_at_k_zero_runs_no_draft_forward_and_catches_up(target, plain_outputs, batch_size, monkeypatch):
    """Lazy feed: a step where nobody drafts runs the target alone; a request that drafts again
    first feeds the draft every token it missed, and the output stays the target's."""
    from speculant.speculative.adaptive import AdaptiveK

    decode_steps = itertools.count()

    def choose(self, requests, k_max, keys=None, backlog=None):  # every fourth decode step the even requests draft
        step = next(decode_steps)
        return [0 if step % 4 or b % 2 else min(k, b % 3 + 1) for b, k in enumerate(k_max)]

    monkeypatch.setattr(AdaptiveK, "choose", choose)
    llm = tiny_llm(target, tiny_hf_model("llama", seed=5, num_hidden_layers=1), num_draft_tokens=3, adaptive_k=True)
    engine, steps, draft_forwards = llm.engine, [0], []  # draft_forwards: (engine step, rows)
    run, step = engine.executor.run, engine.step

    def counted_run(plan):
        if plan.model == "draft":
            draft_forwards.append((steps[0], sum(len(s.token_ids) for s in plan.inputs)))
        return run(plan)

    def counted_step():
        steps[0] += 1
        return step()

    monkeypatch.setattr(engine.executor, "run", counted_run)
    monkeypatch.setattr(engine, "step", counted_step)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    busy = {s for s, _ in draft_forwards}
    assert len(busy) < steps[0] / 2  # without lazy feeding every step would run one
    assert any(rows > 1 for s, rows in draft_forwards if s > 2)  # catch-ups feed the missed tokens


@pytest.mark.parametrize("lazy", [False, True])
def test_feed_time_is_charged_to_drafting_steps_when_the_feed_is_lazy(lazy):
    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0), fed=(lambda ks: len(ks) - ks.count(0)) if lazy else None)
    adaptive._context = 0  # a decode step
    adaptive.record_feed_time(0.5, 1)
    adaptive.record_feed_time(0.8, 4)  # 0.4 s a feed and 0.1 s a request fed
    cost = adaptive.cost_of(100, 2)
    feed = cost([0, 1]) - adaptive.cost.curve(100, 2)(3)
    assert feed == pytest.approx(0.5 if lazy else 0.6, rel=1e-2)  # lazily, the drafting request alone is fed
    assert cost([0, 0]) - adaptive.cost.curve(100, 2)(2) == pytest.approx(0.0 if lazy else 0.6, rel=1e-2)


def _count_draft_rows(monkeypatch, engine) -> list[int]:
    """Rows of every draft-model forward the engine runs from now on."""
    rows, run = [], engine.executor.run

    def counted(plan):
        if plan.model == "draft":
            rows.append(sum(len(s.token_ids) for s in plan.inputs))
        return run(plan)

    monkeypatch.setattr(engine.executor, "run", counted)
    return rows


def test_a_request_that_never_drafts_never_runs_the_draft(target, plain_outputs, monkeypatch):
    """Lazy feed includes the prompt: adaptive k choosing k = 0 throughout costs no draft prefill."""
    from speculant.speculative.adaptive import AdaptiveK

    monkeypatch.setattr(AdaptiveK, "choose", lambda self, requests, k_max, keys=None, backlog=None: [0] * len(requests))
    llm = tiny_llm(target, tiny_hf_model("llama", seed=5, num_hidden_layers=1), num_draft_tokens=3, adaptive_k=True)
    rows = _count_draft_rows(monkeypatch, llm.engine)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    assert rows == []


def test_a_prompt_backlog_is_caught_up_within_the_token_budget_and_priced(target, plain_outputs, monkeypatch):
    """The first drafting step feeds the prompt in forwards of at most max_num_batched_tokens rows
    (a request's chunks in order, one per forward); adaptive k learns its price per token and
    sees every request's backlog."""
    from speculant.speculative.adaptive import AdaptiveK

    backlogs, choose = [], AdaptiveK.choose

    def seen(self, requests, k_max, keys=None, backlog=None):  # every step drafts (tiny models' timings decide nothing)
        backlogs.append(list(backlog))
        return [max(1, k) if m else 0 for k, m in zip(choose(self, requests, k_max, keys, backlog), k_max)]

    monkeypatch.setattr(AdaptiveK, "choose", seen)
    llm = tiny_llm(target, tiny_hf_model("llama", seed=5, num_hidden_layers=1), num_draft_tokens=3, adaptive_k=True,
                   max_num_batched_tokens=8)
    rows = _count_draft_rows(monkeypatch, llm.engine)
    assert [o.token_ids for o in llm.generate(PROMPTS[1:2], GREEDY)] == plain_outputs[1:2]
    assert backlogs[0] == [len(PROMPTS[1]) + 1]  # the prompt and the first sampled token
    chunked = [[8] * (n // 8) + [n % 8] * (n % 8 > 0) for (n,) in backlogs if n > 16]  # the first step that drafts catches up
    assert any(rows[: len(c)] == c for c in chunked) and max(rows) <= 8
    assert llm.engine.proposer.adaptive.catch_up_s.count == 1 and llm.engine.proposer.adaptive.catch_up_s.value > 0


def test_a_backlog_is_caught_up_only_when_the_rest_of_the_answer_pays_for_it():
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (max(ks, default=0), sum(ks)))
    adaptive.cost.theta[:] = 0.0
    adaptive.cost.theta[: len(KNOTS)] = 0.1  # the target: 100 ms a step whatever its rows
    adaptive.draft_cost.a, adaptive.catch_up_s.value = 0.01, 0.005  # 5 ms per backlog token
    for _ in range(50):
        adaptive.tracker.record("r", 3, 3)  # drafts always right: worth 3 more tokens a step

    def k_for(max_tokens: int, backlog: int) -> int:
        request = SimpleNamespace(request_id="r", num_computed_tokens=10, params=SimpleNamespace(max_tokens=max_tokens), output_token_ids=[1])
        return adaptive.choose([request], [3], backlog=[backlog])[0]

    assert k_for(max_tokens=1000, backlog=1000) == 3  # 5 s of catch-up, won back over 1,000 tokens
    assert k_for(max_tokens=8, backlog=1000) == 0  # 7 tokens left: plain decoding
    assert k_for(max_tokens=8, backlog=10) == 3  # a short backlog counts as the feed


def test_a_backlog_past_every_measured_context_waits_for_a_step_there():
    """The catch-up is priced against steps at the request's context: beyond the longest the
    cost model has measured (the calibration's, then every observed step's), its plain step
    comes first; a short backlog (the feed) never waits."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (max(ks, default=0), sum(ks)))
    adaptive.cost.theta[:] = 0.0
    adaptive.cost.theta[: len(KNOTS)] = 0.1
    adaptive.draft_cost.a, adaptive.catch_up_s.value, adaptive.measured_context = 0.01, 0.005, 512
    for _ in range(50):
        adaptive.tracker.record("r", 3, 3)
    request = SimpleNamespace(request_id="r", num_computed_tokens=1300, params=SimpleNamespace(max_tokens=4000),
                              output_token_ids=[1], finished=False)
    assert adaptive.choose([request], [3], backlog=[1300]) == [0]  # 1,300 tokens: never measured
    assert adaptive.choose([request], [3], backlog=[10]) == [3]  # a short backlog is the feed
    adaptive.choose([request], [3], backlog=[1300])
    plain_step = SimpleNamespace(requests=[request], row_offsets=[0, 1], speculative=False, accepted_counts=None)
    adaptive.observe(plain_step, 0.1)  # its plain step at 1,300
    assert adaptive.measured_context == 1300
    request.num_computed_tokens = 1301
    assert adaptive.choose([request], [3], backlog=[1301]) == [3]


def test_planning_rests_while_it_drafts_nothing_in_proportion_to_its_cost(monkeypatch):
    """After a plan that drafts nothing, as many unplanned plain steps follow as keep planning's
    time under PLAN_SHARE of one token's (a plain step over its sequences); a plan that is cheap
    against a token (batch 1) runs every step, and a plan that drafts is followed by another."""
    from types import SimpleNamespace

    from speculant.speculative import adaptive as adaptive_module
    from speculant.speculative.adaptive import PLAN_SHARE, AdaptiveK

    # `observe` adds its own wall time to the plan's; a stopped clock keeps it out, so the plan
    # time is the one given (a slow first call once made 8 rests of 5.4 expected in CI).
    monkeypatch.setattr(adaptive_module, "time", SimpleNamespace(perf_counter=lambda: 0.0))

    def planned_step(adaptive, ks, plan_s, step_s=0.05):
        requests = [SimpleNamespace(request_id=str(b), num_computed_tokens=10, finished=False) for b in range(len(ks))]
        assert not adaptive.resting(requests)
        adaptive._context = 20  # what `choose` leaves for a decode step
        adaptive.record_plan_time(plan_s)
        offsets = list(itertools.accumulate((k + 1 for k in ks), initial=0))
        result = SimpleNamespace(requests=requests, row_offsets=offsets, accepted_counts=[0] * len(ks), speculative=any(ks))
        adaptive.observe(result, step_s)
        rests = 0
        while adaptive.resting(requests):
            rests += 1
        return rests

    assert planned_step(AdaptiveK(lambda ks: (0, 0)), [0], 0.0003, step_s=0.03) == 0  # batch 1: a token is the whole step
    adaptive = AdaptiveK(lambda ks: (0, 0))
    expected = 0.001 / (PLAN_SHARE * 0.05 / 16) - 1  # 1 ms of planning a 50 ms step of 16 sequences: ~5
    assert expected - 1 <= planned_step(adaptive, [0] * 16, 0.001) <= expected + 1
    assert planned_step(adaptive, [1] + [0] * 15, 0.001) == 0  # it drafted: the next step plans


def test_every_step_is_fitted_and_no_row_count_carries_a_set_up_charge():
    """A first step at a row count not run before was once priced apart and charged to every row
    count not run yet; at batch 1 that held the qwen pair at k = 1. Every step is fitted now,
    a slow one only so far (`StepCostModel.update`), and a verify prices as the fit does."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    request = SimpleNamespace(request_id="r", num_computed_tokens=10, finished=False)

    def step(k, seconds):
        adaptive._context = 20
        adaptive.observe(SimpleNamespace(requests=[request], row_offsets=[0, k + 1], accepted_counts=[0], speculative=k > 0), seconds)
        return adaptive.cost.num_updates

    assert step(8, 0.080) == 1 and step(8, 0.031) == 2 and step(0, 0.030) == 3
    cost = adaptive.cost_of(20, 1)
    for k in (1, 3, 8):
        assert cost([k]) == pytest.approx(adaptive.cost.curve(20, 1)(k + 1))


def _decode_step(adaptive, requests, ks, seconds, accepted=None):
    """Commit a decode step of these k's to `adaptive` (what the engine reports after it)."""
    from types import SimpleNamespace

    offsets = list(itertools.accumulate((k + 1 for k in ks), initial=0))
    accepted = list(ks) if accepted is None else accepted
    adaptive.observe(SimpleNamespace(requests=requests, row_offsets=offsets, accepted_counts=accepted, speculative=any(ks)), seconds)


def test_a_plan_that_keeps_drafting_takes_a_plain_step_every_so_often():
    """A fit that sees only drafting steps cannot tell what a plain step costs (the drafting
    steps' knot and the overhead move as one, the plain knot drifts with their shared level):
    after PLAIN_PROBE_EVERY fitted steps without a plain one, a plan that drafts runs plain."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import PLAIN_PROBE_EVERY, AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    requests = [SimpleNamespace(request_id=str(b), num_computed_tokens=10, finished=False) for b in range(2)]
    chosen = []
    for _ in range(3 * PLAIN_PROBE_EVERY + 3):
        ks = adaptive.choose(requests, [4, 4])
        chosen.append(ks)
        _decode_step(adaptive, requests, ks, 0.010 + 0.001 * sum(ks))  # every draft accepted
    plain = [i for i, ks in enumerate(chosen) if not any(ks)]
    assert plain == [PLAIN_PROBE_EVERY, 2 * PLAIN_PROBE_EVERY + 1, 3 * PLAIN_PROBE_EVERY + 2]
    assert all(ks == [4, 4] for i, ks in enumerate(chosen) if i not in plain)  # always right: the largest k


def test_a_plan_that_never_drafts_drafts_one_more_every_so_often_and_so_unlearns_a_spike():
    """The explorer probes acceptance, and what drafting costs is learnt only from drafting
    steps: one refill timed at a second (a spike) priced every draft out, and nothing drafted
    again to correct it (adaptive MTP once took 4,806 plain steps in a row). After
    DRAFT_PROBE_EVERY plans in a row where the explorer drafted no more than the mean's choice,
    it drafts one more; that step's refill time undoes the spike and drafting resumes."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import DRAFT_PROBE_EVERY, PLAIN_PROBE_EVERY, AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0), fed=lambda ks: len(ks) - ks.count(0))  # a lazy feed
    adaptive.cost.theta[:] = 0.0
    adaptive.cost.theta[: len(KNOTS)] = 0.010  # the target: 10 ms whatever its rows
    adaptive.feed_cost.update(1, 1, 0.002)
    adaptive.feed_cost.update(1, 1, 1.0)  # one refill timed at a second
    request = SimpleNamespace(request_id="r", num_computed_tokens=10, finished=False)
    chosen = []
    for _ in range(2 * DRAFT_PROBE_EVERY):
        ks = adaptive.choose([request], [4])
        chosen.append(ks[0])
        if ks[0]:
            adaptive.record_feed_time(0.002, 1)  # what a refill costs
        _decode_step(adaptive, [request], ks, 0.010)  # every draft accepted
    assert chosen.index(1) == DRAFT_PROBE_EVERY and not any(chosen[:DRAFT_PROBE_EVERY])
    after = chosen[DRAFT_PROBE_EVERY + 1 :]  # the probe's refill undid the spike: drafting pays again
    assert after.count(0) <= len(after) // PLAIN_PROBE_EVERY  # plain only to probe a plain step's cost


def test_a_plan_held_at_one_draft_by_a_spiked_draft_forward_probes_the_second():
    """Counted by the mean's choice: probes from 0 to 1 draft do not stand for what a second
    draft (a head forward) costs, so a spike in that cost is probed at k = 1 and undone."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import DRAFT_PROBE_EVERY, AdaptiveK
    from speculant.speculative.drafts import chain_work

    adaptive = AdaptiveK(chain_work)
    adaptive.cost.theta[:] = 0.0
    adaptive.cost.theta[: len(KNOTS)] = 0.010
    adaptive.draft_cost.update(1, 1, 0.002)
    adaptive.draft_cost.update(1, 1, 1.0)  # one draft forward timed at a second
    request = SimpleNamespace(request_id="r", num_computed_tokens=10, finished=False)
    chosen = []
    for _ in range(DRAFT_PROBE_EVERY + 20):
        ks = adaptive.choose([request], [4])
        chosen.append(ks[0])
        if ks[0] > 1:
            adaptive.record_draft_time(0.002 * (ks[0] - 1), chain_work(ks))
        _decode_step(adaptive, [request], ks, 0.010)  # every draft accepted
    first = next(i for i, k in enumerate(chosen) if k > 1)
    assert set(chosen[:first]) <= {0, 1} and chosen[first] == 2 and first <= DRAFT_PROBE_EVERY + 3  # (+ plain probes)
    assert max(chosen[first + 1 :]) == 4  # undone: every draft pays


def test_a_drawn_probe_restarts_the_count_and_no_probe_passes_the_cap():
    from types import SimpleNamespace

    from speculant.speculative.adaptive import DRAFT_PROBE_EVERY, AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    adaptive.cost.theta[:] = 0.0
    adaptive.cost.theta[: len(KNOTS)] = 0.010
    request = SimpleNamespace(request_id="r", num_computed_tokens=10, finished=False)
    for _ in range(3 * DRAFT_PROBE_EVERY):  # every draft right and free: always at the cap, nothing to probe
        ks = adaptive.choose([request], [2])
        assert ks in ([2], [0])  # [0]: the plain probe
        _decode_step(adaptive, [request], ks, 0.010)
    assert adaptive._unprobed == {}  # at the cap: never counted


def test_an_unplanned_plain_step_is_fitted_and_teaches_nothing_else():
    """Rest steps (planning found nothing to draft lately) are plain steps whose time the cost
    model fits, so a plain step's cost follows the machine and the context where most steps
    rest; acceptance and planning's own costs learn nothing from them."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    requests = [SimpleNamespace(request_id=str(b), num_computed_tokens=100, finished=False) for b in range(16)]
    adaptive.choose(requests, [0] * 16)
    adaptive.record_plan_time(0.002)  # planning dear against a token: rests follow
    _decode_step(adaptive, requests, [0] * 16, 0.050)
    updates, tracker, step_s = adaptive.cost.num_updates, dict(adaptive.tracker._counts), adaptive.step_s.value
    rests = 0
    while adaptive.resting(requests):  # 1,600 context tokens
        _decode_step(adaptive, requests, [0] * 16, 0.080)  # the machine slowed down
        rests += 1
    assert rests > 0 and adaptive.cost.num_updates == updates + rests
    assert adaptive.cost.predict([0] * 16, 1600) > 0.060  # followed the slower plain steps
    assert adaptive.tracker._counts == tracker and adaptive.step_s.value == step_s


def test_a_plan_asks_the_proposer_only_when_it_does_not_rest():
    """`plan` is `choose` over the proposer's offers and backlogs; while planning rests it asks
    nothing and every k is 0."""
    from types import SimpleNamespace

    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    requests = [SimpleNamespace(request_id=str(b), num_computed_tokens=10, params=None, output_token_ids=[]) for b in range(2)]
    asked = []
    offer = lambda r: asked.append(r.request_id) or (0, None)  # noqa: E731
    assert adaptive.plan(requests, offer, lambda r: 0) == [0, 0] and asked == ["0", "1"]
    adaptive._rest, asked[:] = 1, []
    assert adaptive.plan(requests, offer, lambda r: 0) == [0, 0] and asked == []


def test_a_calibration_seeds_the_cost_model_and_the_measured_context():
    from speculant.speculative.adaptive import AdaptiveK

    adaptive = AdaptiveK(lambda ks: (0, 0))
    prior = adaptive.cost
    adaptive.use_calibration([])
    assert adaptive.cost is prior and adaptive.measured_context == 0
    samples = [([k], 64, 0.01 + 0.001 * k) for k in range(9)] + [([0] * 8, 512, 0.02), ([0], 512, 0.015)]
    adaptive.use_calibration(samples)
    assert adaptive.cost is not prior and adaptive.cost.calibration == samples
    assert adaptive.measured_context == 512
    assert adaptive.stats()["step_cost_calibration"] == samples
