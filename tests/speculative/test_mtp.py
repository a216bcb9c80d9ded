"""MTP speculation with a draft head: lossless under greedy decoding for any batch and k, the
head's alignment (shift by one), its carried logits after a partial accept equal to a fresh
prefill's, and no host read between the verify forward and the head run."""

from __future__ import annotations

import pytest
import torch
from testkit import (
    MIXED_PROMPTS,
    TinyCheckpoint,
    fit_head,
    greedy_params,
    strict_decode_step,
    tiny_hf_model,
    tiny_llm,
)

from speculant import SamplingParams
from speculant.executor.plan import TARGET
from speculant.utils import sync
from speculant.utils.tensor_bytes import tensor_bytes

GREEDY = greedy_params()
PROMPTS = MIXED_PROMPTS


def mtp_llm(target, head, **options):
    options.setdefault("adaptive_k", False)  # these tests check the schedule at a fixed k (test_adaptive: adaptive k)
    return tiny_llm(target, speculative="mtp", draft_checkpoint=head, **options)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_mtp_greedy_equals_plain(target, head, plain_outputs, k, batch_size):
    llm = mtp_llm(target, head, num_draft_tokens=k)
    outs = llm.generate(PROMPTS[:batch_size], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:batch_size]
    stats = llm.stats()
    assert stats["accepted_tokens"] > 0
    if batch_size > 1:  # prompts the head was not fitted on: rejections too
        assert stats["accepted_tokens"] < stats["draft_tokens"]
    assert stats["kv_pages_used"] == 0


def test_mtp_with_chunked_prefill_and_preemption(target, head, plain_outputs):
    """Long prompts prefilled in chunks (the head follows each chunk) and a cache so small
    that sequences are preempted and recomputed."""
    llm = mtp_llm(target, head, num_draft_tokens=3, max_num_batched_tokens=8, num_pages=40)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    assert llm.stats()["kv_pages_used"] == 0


def test_head_overfit_on_a_sequence_predicts_it(target):
    """Shift by one: a head fitted on one greedy continuation drafts it exactly (k = 1: each
    draft comes from the head run over the target's own states)."""
    prompt = [11, 12, 13]
    out = tiny_llm(target).generate([prompt], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    head = fit_head(target, [prompt + out.token_ids], steps=300)
    llm = mtp_llm(target, head, num_draft_tokens=1)
    again = llm.generate([prompt], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    assert again.token_ids == out.token_ids
    assert llm.stats()["acceptance_rate"] == 1.0


@pytest.fixture(scope="module")
def eagle3_head(target, plain_outputs):
    """An eagle3 head (the target's feature layers in) fitted like `head`."""
    sequences = [p + o for p, o in zip(PROMPTS[::2], plain_outputs[::2])]
    return fit_head(target, sequences, variant="eagle3", steps=150)


@pytest.fixture(scope="module")
def reduced_head(target, plain_outputs):
    """A head whose vocabulary is the tokens of the sequences it is fitted on."""
    sequences = [p + o for p, o in zip(PROMPTS[::2], plain_outputs[::2])]
    kept = torch.tensor(sorted({t for s in sequences for t in s}))
    return fit_head(target, sequences, steps=100, vocab_map=kept)


def test_reduced_vocabulary_head_stays_lossless(target, reduced_head, plain_outputs):
    llm = mtp_llm(target, reduced_head, num_draft_tokens=3)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    assert llm.stats()["accepted_tokens"] > 0


def test_reduced_vocabulary_head_over_bf16_target_weights(target, reduced_head):
    """The head's rows gathered from a bf16 lm_head score fp32 states (weights="bf16")."""
    plain = [o.token_ids for o in tiny_llm(target, weights="bf16").generate(PROMPTS, GREEDY)]
    llm = mtp_llm(target, reduced_head, num_draft_tokens=2, weights="bf16")
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert llm.stats()["accepted_tokens"] > 0


def test_carried_head_logits_after_a_partial_accept_equal_a_fresh_prefill(target, head):
    """After a step that accepts some drafts but not all, the head's carried logits and state
    (its entry at the last accepted row, not the last verified one) are those a fresh prefill of
    the sequence leaves it."""
    llm = mtp_llm(target, head, num_draft_tokens=3)
    engine, spec = llm.engine, llm.engine.stats.spec_stats
    request = engine.add_request(PROMPTS[0], GREEDY)  # a prompt the head was fitted on: most drafts accepted
    engine.step()  # prefill
    for _ in range(GREEDY.max_tokens // 2):
        accepted, drafted = spec.accepted_tokens, spec.draft_tokens
        engine.step()
        if 0 < spec.accepted_tokens - accepted < spec.draft_tokens - drafted:
            break
    else:
        pytest.fail("no step accepted only some of its drafts")
    fresh = mtp_llm(target, head, num_draft_tokens=3).engine
    again = fresh.add_request(request.all_token_ids[:-1], GREEDY)
    fresh.step()
    assert again.output_token_ids == [request.all_token_ids[-1]]
    mine, theirs = engine.proposer, fresh.proposer
    assert torch.allclose(mine.carried[request.request_id], theirs.carried[again.request_id], atol=1e-4)
    assert torch.allclose(mine.state[request.request_id], theirs.state[again.request_id], atol=1e-4)


def test_head_shares_the_targets_tensors(target, head):
    llm = mtp_llm(target, head)
    executor = llm.engine.executor
    assert executor.runner("head").model.target is executor.runner(TARGET).model  # embedding and lm_head read, not copied
    plan, head_model = llm.engine.memory, executor.runner("head").model
    # the head reaches the target's tensors; the plan counts them once, as the target's
    assert plan.target_weights + plan.draft_weights == tensor_bytes(head_model)


def test_no_host_read_between_verify_and_the_head_run(target, head, monkeypatch):
    """Host reads of a decode step, counted as an accelerator would pay them (CPU tensors
    included): none between the target's verify forward and launching the head over it."""
    llm = mtp_llm(target, head, num_draft_tokens=3)
    engine, marks = llm.engine, {}
    run, launch = engine.executor.run, engine.proposer.launch

    def run_counting(plan):
        out = run(plan)
        if plan.model == TARGET:
            marks["after_target"] = sync.host_reads()
        return out

    def launch_counting(result):
        marks["at_launch"] = sync.host_reads()
        return launch(result)

    monkeypatch.setattr(engine.executor, "run", run_counting)
    monkeypatch.setattr(engine.proposer, "launch", launch_counting)
    engine.add_request(PROMPTS[1], GREEDY)
    engine.step()  # prefill
    with sync.counting_cpu_reads():
        before = sync.host_reads()
        engine.step()
        total = sync.host_reads() - before
    assert engine.stats.spec_stats.draft_steps == 1
    assert marks["at_launch"] == marks["after_target"]
    assert total == 1  # the step's one read: emitted tokens and counts, after the head was launched


def test_a_head_for_another_target_is_refused(target, head):
    other = tiny_hf_model("llama", seed=3)
    with pytest.raises(Exception, match="trained for target"):
        tiny_llm(other, speculative="mtp", draft_checkpoint=head)
    assert TinyCheckpoint  # the tiny target's sha256 is of its tensors


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", ["normed", "eagle3"])
def test_no_sync_from_verify_to_head_launch_on_cuda(target, head, eagle3_head, variant, monkeypatch):
    """On CUDA, from the end of every target forward (prefill and verify) to the head run over it,
    nothing synchronises with the host (`set_sync_debug_mode("error")` raises on a sync); an
    eagle3 head's target forwards expose its feature layers."""
    llm = mtp_llm(target, head if variant == "normed" else eagle3_head, num_draft_tokens=3, device="cuda")
    engine = llm.engine
    run, launch, windows = engine.executor.run, engine.proposer.launch, []

    def run_then_watch(plan):
        out = run(plan)
        if plan.model == TARGET:
            torch.cuda.set_sync_debug_mode("error")  # until the head's launch returns
            windows.append(plan)
        return out

    def launch_then_stop(result):
        yield from launch(result)
        torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(engine.executor, "run", run_then_watch)
    monkeypatch.setattr(engine.proposer, "launch", launch_then_stop)
    try:
        engine.add_request(PROMPTS[1], GREEDY)
        for _ in range(3):
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert windows and engine.stats.spec_stats.draft_steps >= 1


@pytest.mark.parametrize(("sampling", "variant"), [("greedy", "normed"), ("sample", "normed"), ("greedy", "eagle3")])
def test_one_host_read_per_decode_step_strict(target, head, eagle3_head, sampling, variant):
    """A decode step in strict sync mode (any other read raises) under the device-mixing check:
    one host read, for greedy and sampled heads (and an eagle3 head), mixed parameters at batch 3."""

    llm = mtp_llm(target, head if variant == "normed" else eagle3_head, num_draft_tokens=3, head_sampling=sampling)
    params = [GREEDY, SamplingParams(max_tokens=24, temperature=0.8, seed=3, logprobs=True, top_logprobs=2), SamplingParams(max_tokens=24, temperature=0.7)]
    reads, drafted = strict_decode_step(llm, PROMPTS[:3], params)
    assert reads == 1
    assert drafted > 0
    assert llm.stats()["host_reads_per_step"] == 1.0
