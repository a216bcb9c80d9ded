"""After every step, the draft model's carried state is what a fresh draft would compute.

The draft is one token ahead of the target: its KV and its carried logits (the first draft
distribution of the next step) must be those of a forward over exactly the accepted tokens, with
no trace of rejected drafts. A weak draft (the target plus noise) makes partial acceptances and
rejections common.
"""

from __future__ import annotations

import pytest
import torch
from testkit import TinyCheckpoint, noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.attention.batch import SeqInput
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], list(range(50, 61)), [9, 9, 9, 9], [7, 1]]


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def weak_draft(target):
    return noisy_copy(target)


def fresh_draft_logits(draft_hf, config, tokens: list[int], page_size: int) -> torch.Tensor:  # [V]
    """The draft's next-token logits from a new runner that has seen only `tokens`."""
    fresh = Executor(build_runner(TinyCheckpoint(draft_hf), config))
    num_pages = -(-len(tokens) // page_size)
    fresh.allocate_kv(num_pages, page_size)
    return fresh.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, list(range(num_pages)))])).logits[0]


@pytest.mark.parametrize(
    ("draft_sampling", "temperature", "num_pages"),
    [("greedy", 0.0, 256), ("sample", 1.0, 256), ("greedy", 0.0, 16)],  # the last one preempts
)
def test_carried_logits_equal_fresh_draft_after_every_step(target, weak_draft, draft_sampling, temperature, num_pages):
    llm = tiny_llm(target, weak_draft, num_draft_tokens=3, draft_sampling=draft_sampling, num_pages=num_pages, seed=3, adaptive_k=False)
    engine, proposer = llm.engine, llm.engine.proposer
    for prompt in PROMPTS:
        engine.add_request(prompt, SamplingParams(max_tokens=16, temperature=temperature, ignore_eos=True))
    checked = steps = 0
    while engine.has_unfinished():
        steps += 1
        engine.step()
        for request in engine.scheduler.running:
            if request.request_id not in proposer.carried:
                continue  # not fed yet (its prefill has not started)
            n = proposer.computed[request.request_id]
            if not request.is_prefill:
                assert n == request.num_tokens  # the draft is one token ahead of the target
            expected = fresh_draft_logits(weak_draft, llm.config.model, request.all_token_ids[:n], engine.pages.page_size)
            torch.testing.assert_close(proposer.carried[request.request_id], expected, atol=1e-4, rtol=1e-4)
            checked += 1
    stats = llm.stats()
    assert checked >= steps
    assert stats["draft_tokens"] > 0 and 0 < stats["acceptance_rate"] < 1  # steps with rejections
    if num_pages == 16:
        assert stats["preemptions"] > 0
