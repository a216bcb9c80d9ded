"""What proposers receive after each step: one StepResult over the step's flat target forward."""

from __future__ import annotations

import pytest
import torch
from testkit import TinyCheckpoint, noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.attention.batch import SeqInput
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], list(range(50, 61))]


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


def recorded_steps(llm) -> list[tuple]:
    """(StepResult, each request's token count before the step) for every step of a run."""
    proposer, steps = llm.engine.proposer, []
    update = proposer.update

    def recording(result):
        before = [r.num_tokens - len(e) for r, e in zip(result.requests, result.emitted_token_ids)]
        for r, e, n in zip(result.requests, result.emitted_token_ids, before):
            assert r.all_token_ids[n:] == e  # exactly the tokens appended to the request
        steps.append((result, before))
        return update(result)

    proposer.update = recording
    llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    return steps


def fresh_hidden(target_hf, config, tokens: list[int]) -> torch.Tensor:  # [len(tokens), hidden]
    fresh = Executor(build_runner(TinyCheckpoint(target_hf), config))
    fresh.allocate_kv(16, 4)
    return fresh.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, list(range(16)), logits="none")])).hidden


def test_speculative_step_results(target):
    llm = tiny_llm(target, noisy_copy(target), num_draft_tokens=3, max_num_batched_tokens=16, adaptive_k=False)  # every decode step verifies
    steps = recorded_steps(llm)
    speculative = [(s, before) for s, before in steps if s.speculative]
    assert speculative and len(speculative) < len(steps)  # prefill steps are plain
    for step, before in speculative:
        assert step.hidden_states.shape == (step.row_offsets[-1], target.config.hidden_size)
        accepted, bonus = step.num_accepted.tolist(), step.bonus_token_ids.tolist()
        for b, r in enumerate(step.requests):
            if r.finished:
                continue  # max_tokens may cut what was emitted
            emitted = step.emitted_token_ids[b]
            assert len(emitted) == accepted[b] + 1 and bonus[b] == emitted[-1]
            start, end = step.row_offsets[b], step.row_offsets[b] + accepted[b] + 1
            assert step.row_offsets[b + 1] >= end  # k_b + 1 rows, the accepted ones first
            # The accepted rows are the target's states at the tokens this step committed behind.
            tokens = r.all_token_ids[: before[b] + accepted[b]]
            expected = fresh_hidden(target, llm.config.model, tokens)[before[b] - 1 :]
            torch.testing.assert_close(step.hidden_states[start:end], expected, atol=1e-4, rtol=1e-4)
    assert any(max(s.num_accepted.tolist()) > 0 for s, _ in speculative)


def test_plain_step_results(target):
    steps = recorded_steps(tiny_llm(target, speculative="none", max_num_batched_tokens=16))
    assert any(-1 in s.bonus_token_ids.tolist() for s, _ in steps)  # a prefill chunk sampled nothing
    for step, _ in steps:
        assert not step.speculative and step.num_accepted.tolist() == [0] * len(step.requests)
        assert step.hidden_states.shape[0] == step.row_offsets[-1]
        for b, emitted in enumerate(step.emitted_token_ids):
            assert emitted == ([] if step.bonus_token_ids[b] == -1 else [int(step.bonus_token_ids[b])])
