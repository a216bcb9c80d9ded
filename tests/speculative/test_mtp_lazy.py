"""MTP with adaptive k follows lazily: a request that does not draft leaves its target states
waiting instead of running the head, and runs them when it drafts again; the drafts are those of
a head that followed every step, and the output stays plain decoding's."""

from __future__ import annotations

import itertools

import pytest
from testkit import MIXED_PROMPTS, greedy_params, record_drafts_and_head_rows, tiny_llm

from speculant.speculative import mtp
from speculant.speculative.adaptive import AdaptiveK

GREEDY = greedy_params()
PROMPTS = MIXED_PROMPTS


def run_pattern(target, head, batch_size, monkeypatch, lazy: bool):
    """Every fifth decode step the even requests draft (k 1-3); (outputs, drafts, head forwards
    as (engine step, rows))."""
    steps = itertools.count()

    def choose(self, requests, k_max, keys=None, backlog=None):
        step = next(steps)
        return [0 if step % 5 or b % 2 else min(k, b % 3 + 1) for b, k in enumerate(k_max)]

    monkeypatch.setattr(AdaptiveK, "choose", choose)
    monkeypatch.setattr(mtp.MtpProposer, "LAZY_FEED", lazy)
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=3, adaptive_k=True)
    engine, drafts, forwards, step_no = llm.engine, [], [], [0]
    run, step, propose = engine.executor.run, engine.step, engine.proposer.propose

    def counted_run(plan):
        if plan.model == mtp.HEAD:
            forwards.append((step_no[0], sum(len(s.token_ids) for s in plan.inputs)))
        return run(plan)

    def counted_step():
        step_no[0] += 1
        return step()

    def recorded_propose(batch):
        proposal = yield from propose(batch)
        drafts.append(proposal.token_ids.tolist())
        return proposal

    monkeypatch.setattr(engine.executor, "run", counted_run)
    monkeypatch.setattr(engine, "step", counted_step)
    monkeypatch.setattr(engine.proposer, "propose", recorded_propose)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    return [o.token_ids for o in outs], drafts, forwards, step_no[0]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_lazy_head_drafts_as_a_following_one_and_stays_lossless(target, head, plain_outputs, batch_size, monkeypatch):
    outs, drafts, forwards, steps = run_pattern(target, head, batch_size, monkeypatch, lazy=True)
    assert outs == plain_outputs[:batch_size]
    following = run_pattern(target, head, batch_size, monkeypatch, lazy=False)
    assert following[0] == outs and following[1] == drafts  # the catch-ups leave the head where following it would
    busy = {s for s, _ in forwards}
    assert len(busy) < steps / 2 < len({s for s, _ in following[2]})  # the head rests on steps nobody drafts
    assert any(rows > 3 for s, rows in forwards if s > 2)  # a catch-up runs the rows it missed


def test_a_backlog_past_its_cap_is_run_without_a_draft(target, head, monkeypatch):
    """A request that never drafts keeps at most BACKLOG_ROWS target states waiting."""
    monkeypatch.setattr(mtp, "BACKLOG_ROWS", 4)
    monkeypatch.setattr(AdaptiveK, "choose", lambda self, requests, k_max, keys=None, backlog=None: [0] * len(requests))
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=3, adaptive_k=True)
    request = llm.engine.add_request(PROMPTS[0], GREEDY)
    seen = []
    while not request.finished:
        llm.engine.step()
        seen.append(llm.engine.proposer.backlog(request))
    assert max(seen) == 4 and 0 in seen[1:-1]  # emptied every few steps, before the request finished


def run_tree_pattern(target, head, monkeypatch, lazy: bool):
    """EAGLE with adaptive k: every fifth decode step grows a tree of the full budget, the others
    take budget 0 (a plain step); (outputs, trees, head forwards' rows per engine step)."""
    from speculant.speculative.eagle import EagleProposer
    from speculant.speculative.tree_budget import TreeBudget

    steps = itertools.count()
    monkeypatch.setattr(TreeBudget, "choose", lambda self: self.max_budget if next(steps) % 5 == 0 else 0)
    monkeypatch.setattr(EagleProposer, "follows_lazily", lambda self: lazy)
    llm = tiny_llm(target, speculative="eagle", draft_checkpoint=head, num_draft_tokens=6, adaptive_k=True)
    trees, forwards = record_drafts_and_head_rows(llm, monkeypatch, mtp.HEAD)
    outs = llm.generate(PROMPTS[:3], GREEDY)
    return [o.token_ids for o in outs], trees, forwards


def test_an_eagle_tree_after_plain_steps_is_the_one_a_following_head_grows(target, head, plain_outputs, monkeypatch):
    outs, trees, forwards = run_tree_pattern(target, head, monkeypatch, lazy=True)
    assert outs == plain_outputs[:3] and trees
    following = run_tree_pattern(target, head, monkeypatch, lazy=False)
    assert following[0] == outs and following[1] == trees
    assert len(forwards) < len(following[2])  # plain steps ran no head forward
