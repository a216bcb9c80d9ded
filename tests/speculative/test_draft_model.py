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
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
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


def test_vocabulary_mismatch_is_a_clear_error(target):
    other = tiny_hf_model("llama", vocab_size=300)
    with pytest.raises(ValueError, match="vocabulary"):
        tiny_llm(target, other)
