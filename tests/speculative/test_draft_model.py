"""Draft-target speculation is lossless under greedy decoding, and its draft KV stays exact."""

from __future__ import annotations

import pytest
import torch
from testkit import MIXED_PROMPTS, TinyCheckpoint, greedy_params, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.attention.batch import SeqInput
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.speculative.draft_model import DRAFT

GREEDY = greedy_params()
PROMPTS = MIXED_PROMPTS


@pytest.fixture(scope="module")
def weak_draft():
    return tiny_hf_model("llama", seed=5, num_hidden_layers=1)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_weak_draft_greedy_equals_plain(target, weak_draft, plain_outputs, k, batch_size):
    llm = tiny_llm(target, weak_draft, num_draft_tokens=k, adaptive_k=False)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    stats = llm.stats()
    assert stats["draft_tokens"] > 0
    assert stats["kv_pages_used"] == 0


def test_the_draft_s_own_weights_mode_keeps_the_target_s_output(target, weak_draft, plain_outputs):
    """draft_weights="int8" quantizes the draft alone (the target stays fp32): drafts are only
    proposals, so the output is the target's."""
    from speculant.layers.linear import DenseLinear, Int8Linear

    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, adaptive_k=False, draft_weights="int8")
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    runners = llm.engine.executor._runners
    assert isinstance(runners[DRAFT].model.layers[0].gate_up, Int8Linear)
    assert isinstance(runners[TARGET].model.layers[0].gate_up, DenseLinear)
    assert llm.stats()["draft_tokens"] > 0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_target_as_own_draft_accepts_everything(target, plain_outputs, k):
    llm = tiny_llm(target, target, num_draft_tokens=k, adaptive_k=False)
    n = 1 + 3 * (k + 1)  # the prefill's token, then three full steps: no step is cut to fit max_tokens
    outs = llm.generate(PROMPTS, greedy_params(n))
    assert [o.token_ids for o in outs] == [p[:n] for p in plain_outputs]
    stats = llm.stats()
    assert stats["acceptance_rate"] == 1.0
    assert stats["tau"] == k + 1
    assert stats["acceptance_by_position"] == [1.0] * k
    for out in outs:
        assert out.stats.tau == k + 1


def test_per_request_k_mixed_in_one_batch(target, weak_draft, plain_outputs):
    llm = tiny_llm(target, weak_draft, num_draft_tokens=6, adaptive_k=False)
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, num_draft_tokens=k) for k in (0, 1, 4, 2, 6, 3, 0, 5)]
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == plain_outputs
    assert outs[0].stats.draft_tokens == 0 and outs[4].stats.draft_tokens > 0


def test_preemption_during_speculation_keeps_outputs(target, weak_draft, plain_outputs):
    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, num_pages=24, adaptive_k=False)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    assert llm.stats()["preemptions"] > 0
    assert llm.stats()["kv_pages_used"] == 0


def test_draft_kv_equals_fresh_prefill(target, weak_draft):
    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, adaptive_k=False)
    engine = llm.engine
    for prompt in PROMPTS[:4]:
        engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    for _ in range(8):
        engine.step()
    proposer, draft_kv = engine.proposer, engine.executor.runner(DRAFT).kv
    fresh = Executor(build_runner(TinyCheckpoint(weak_draft), llm.config.model))
    fresh.allocate_kv(64, engine.pages.page_size)
    fresh_kv = fresh.runner(TARGET).kv
    for request in engine.scheduler.running:
        n = proposer.computed[request.request_id]
        assert n == request.num_tokens  # the draft is one token ahead of the target
        table = list(range(64))
        fresh.run(ForwardPlan(TARGET, [SeqInput(request.all_token_ids[:n], 0, table)]))
        ours, theirs = draft_kv.slots(engine.pages.table(request.request_id), n), fresh_kv.slots(table, n)
        torch.testing.assert_close(draft_kv.k[:, ours], fresh_kv.k[:, theirs], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(draft_kv.v[:, ours], fresh_kv.v[:, theirs], atol=1e-5, rtol=1e-5)


LONG_PROMPTS = [list(range(10, 40)), list(range(100, 117)), [5, 6, 7, 8, 9], list(range(60, 81))]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("budget", [8, 256])
def test_a_draft_window_keeps_the_target_s_output(target, weak_draft, batch_size, budget):
    """draft_window=6: the draft reads 4 sink tokens and the last 6 of each long prompt. Its
    drafts change, the output does not; a small token budget prefills in chunks, some of them
    wholly outside the window (the draft then runs nothing for them)."""
    plain = tiny_llm(target, max_num_batched_tokens=budget).generate(LONG_PROMPTS[:batch_size], GREEDY)
    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, draft_window=6, max_num_batched_tokens=budget)
    outs = llm.generate(LONG_PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert llm.stats()["draft_tokens"] > 0 and llm.stats()["kv_pages_used"] == 0


def _windowed_kv_matches_fresh_prefill(llm, draft_hf, window: int) -> None:
    """Every running request's draft K/V equals a fresh draft forward over its sinks and window
    (at their own positions) and the tokens after them, in compact slots."""
    engine = llm.engine
    proposer, draft_kv = engine.proposer, engine.executor.runner(DRAFT).kv
    fresh = Executor(build_runner(TinyCheckpoint(draft_hf), llm.config.model))
    fresh.allocate_kv(64, engine.pages.page_size)
    fresh_kv, table = fresh.runner(TARGET).kv, list(range(64))
    for request in engine.scheduler.running:
        n, p = proposer.computed[request.request_id], request.num_prompt_tokens
        hidden = max(0, p - 4 - window)
        positions = [i for i in range(n) if not 4 <= i < 4 + hidden]
        tokens = [request.all_token_ids[i] for i in positions]
        fresh.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, table, positions=positions)]))
        ours, theirs = draft_kv.slots(engine.pages.table(request.request_id), len(tokens)), fresh_kv.slots(table, len(tokens))
        torch.testing.assert_close(draft_kv.k[:, ours], fresh_kv.k[:, theirs], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(draft_kv.v[:, ours], fresh_kv.v[:, theirs], atol=1e-5, rtol=1e-5)


def test_a_windowed_draft_kv_equals_a_fresh_prefill_of_its_window(target, weak_draft):
    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, draft_window=6, max_num_batched_tokens=8)
    for prompt in LONG_PROMPTS:
        llm.engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    for _ in range(12):
        llm.engine.step()
    _windowed_kv_matches_fresh_prefill(llm, weak_draft, 6)


def test_a_windowed_catch_up_feeds_only_the_window_in_budget_sized_forwards(target, weak_draft):
    """The lazy catch-up (adaptive k's path) of a whole prompt: the forwards hold at most the
    token budget of tokens the draft reads, the hidden span costs nothing, and the K/V is the
    window's."""
    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, draft_window=9, max_num_batched_tokens=5)
    engine = llm.engine
    for prompt in LONG_PROMPTS[:2]:
        engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    while any(r.is_prefill for r in engine.scheduler.running) or len(engine.scheduler.running) < 2:
        engine.step()
    proposer, runs = engine.proposer, []
    for r in engine.scheduler.running:
        proposer.release(r)
    original = engine.executor.run
    engine.executor.run = lambda plan: runs.append(sum(len(x.token_ids) for x in plan.inputs)) or original(plan)
    behind = [f for r in engine.scheduler.running for f in proposer._lacking(r, r.num_tokens)]
    engine.executor.drive(proposer._catch_up(behind))
    assert max(runs) <= 5 and sum(runs) == sum(min(r.num_tokens, 4 + 9 + r.num_tokens - r.num_prompt_tokens) for r in engine.scheduler.running)
    assert all(proposer.backlog(r) == 0 for r in engine.scheduler.running)
    _windowed_kv_matches_fresh_prefill(llm, weak_draft, 9)


def test_vocabulary_mismatch_is_a_clear_error(target):
    other = tiny_hf_model("llama", vocab_size=300)
    with pytest.raises(ValueError, match="vocabulary"):
        tiny_llm(target, other)
