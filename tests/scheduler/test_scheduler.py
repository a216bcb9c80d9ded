"""Continuous batching under page pressure: many more requests than pages all finish through
preemption by recompute, each with exactly the tokens it gets running alone (greedy, and sampled
with a per-request seed); admission is FCFS, no step passes the token budget, no page leaks."""

from __future__ import annotations

import functools

import pytest
import torch
from testkit import tiny_hf_model, tiny_llm

from speculant.core import Request
from speculant.sampling.params import SamplingParams

NUM_REQUESTS, PAGE_SIZE, MAX_TOKENS = 24, 4, 10
NUM_PAGES = 16  # a sequence reaches 22 tokens (6 pages): room for about three at once


@functools.cache
def _hf():
    return tiny_hf_model("llama", seed=7)


def _prompts(n: int = NUM_REQUESTS, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 13, (n,), generator=gen).tolist()
    return [[1] + torch.randint(3, 256, (k - 1,), generator=gen).tolist() for k in lengths]


def _params(kind: str, i: int) -> SamplingParams:
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return SamplingParams(
        temperature=0.9, top_k=40, max_tokens=MAX_TOKENS, ignore_eos=True, seed=1000 + i
    )


@functools.cache
def _alone(kind: str, i: int, prompt: tuple[int, ...]) -> list[int]:
    llm = tiny_llm(_hf(), num_pages=64)
    return llm.generate(list(prompt), _params(kind, i))[0].token_ids


class StepLog:
    """Wraps an engine's scheduler to record each step's batch."""

    def __init__(self, engine) -> None:
        self.batches: list[list[tuple[Request, int, int]]] = []  # (request, num_computed, num_new)
        schedule = engine.scheduler.schedule

        def recording():
            batch = schedule()
            self.batches.append(
                [(s.request, s.request.num_computed_tokens, s.num_new_tokens) for s in batch.seqs]
            )
            return batch

        engine.scheduler.schedule = recording

    def tokens_per_step(self) -> list[int]:
        return [sum(n for _, _, n in b) for b in self.batches]

    def first_scheduled(self) -> list[str]:
        order: list[str] = []
        for batch in self.batches:
            order += [r.request_id for r, _, _ in batch if r.request_id not in order]
        return order


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_preemption_by_recompute_matches_running_alone(kind: str, overlap: bool) -> None:
    llm = tiny_llm(_hf(), num_pages=NUM_PAGES, max_num_batched_tokens=32, overlap=overlap)
    engine = llm.engine
    log = StepLog(engine)
    prompts = _prompts()
    outs = llm.generate(prompts, [_params(kind, i) for i in range(NUM_REQUESTS)])
    assert engine.stats.preemptions > 0, (
        "the cache was never short: the test does not test preemption"
    )
    assert sum(o.stats.num_preemptions for o in outs) == engine.stats.preemptions
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        assert out.finish_reason == "length" and len(out.token_ids) == MAX_TOKENS
        assert out.token_ids == _alone(kind, i, tuple(prompt)), (
            f"request {i} ({out.stats.num_preemptions} preemptions)"
        )
    assert max(log.tokens_per_step()) <= 32
    assert engine.pages.allocator.num_used == 0 and engine.pages.num_seqs == 0
    assert not engine.has_unfinished() and not engine.requests


def test_recompute_reproduces_kv_of_preempted_request() -> None:
    """A preempted request's re-admission feeds prompt + output so far and samples after it."""
    llm = tiny_llm(_hf(), num_pages=NUM_PAGES)
    log = StepLog(llm.engine)
    llm.generate(_prompts(), _params("greedy", 0))
    readmissions = [
        (r, new)
        for batch in log.batches
        for r, computed, new in batch
        if computed == 0 and r.num_preemptions > 0
    ]
    assert readmissions
    # A readmitted request recomputes more than its prompt: the output so far is part of it.
    assert any(new > r.num_prompt_tokens for r, new in readmissions)


def test_fcfs_admission_and_token_budget() -> None:
    budget = 8
    llm = tiny_llm(_hf(), num_pages=NUM_PAGES, max_num_batched_tokens=budget, max_num_seqs=3)
    engine = llm.engine
    log = StepLog(engine)
    prompts = _prompts(12, seed=3)
    outs = llm.generate(prompts, _params("greedy", 0))
    ids = [o.request_id for o in outs]
    assert log.first_scheduled() == ids, "requests must start in arrival order"
    assert max(log.tokens_per_step()) <= budget
    assert max(len(b) for b in log.batches) <= 3
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == _alone("greedy", 0, tuple(prompt))
    assert engine.pages.allocator.num_used == 0


def test_head_of_queue_is_not_overtaken() -> None:
    """A long prompt at the head waits for pages; shorter ones behind it do not jump the queue."""
    llm = tiny_llm(_hf(), num_pages=8)  # 32 slots
    engine = llm.engine
    log = StepLog(engine)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    first = engine.add_request(
        list(range(3, 19)), greedy
    )  # 16 tokens: 5 pages with its first output
    long = engine.add_request(list(range(20, 40)), greedy)  # 20 tokens: cannot start beside `first`
    short = engine.add_request([5, 6], greedy)  # would fit, but arrived later
    while engine.has_unfinished():
        engine.step()
    order = log.first_scheduled()
    assert order == [first.request_id, long.request_id, short.request_id]
    assert engine.pages.allocator.num_used == 0


def test_abort_returns_pages_and_others_continue() -> None:
    llm = tiny_llm(_hf(), num_pages=NUM_PAGES)
    engine = llm.engine
    prompts = _prompts(6, seed=4)
    requests = [engine.add_request(p, _params("greedy", 0)) for p in prompts]
    for _ in range(3):
        engine.step()
    aborted = engine.abort_request(requests[1].request_id)
    assert aborted.finished and aborted.finish_reason == "abort"
    assert requests[1].request_id not in engine.pages
    assert engine.abort_request(requests[1].request_id) is None
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    for i, (prompt, r) in enumerate(zip(prompts, requests, strict=True)):
        if i != 1:
            assert done[r.request_id] == _alone("greedy", 0, tuple(prompt))
    assert engine.pages.allocator.num_used == 0


def _run_to_completion(engine, max_steps: int = 500) -> dict[str, object]:
    done = {}
    for _ in range(max_steps):
        done.update({o.request_id: o for o in engine.step() if o.finished})
        if not engine.has_unfinished():
            return done
    raise AssertionError(f"requests still unfinished after {max_steps} steps: the engine is stuck")


def test_sequence_outgrowing_the_whole_cache_finishes_with_length() -> None:
    """16 slots hold 17 tokens (the last is never fed back); a request asking for more stops there
    instead of preempting itself forever, and a request beside it still finishes."""
    llm = tiny_llm(_hf(), num_pages=4)
    engine = llm.engine
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    big = engine.add_request([1, 5, 6, 7, 8], greedy)
    small = engine.add_request(
        [1, 9], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    )
    done = _run_to_completion(engine)
    assert done[big.request_id].finish_reason == "length" and big.num_tokens == 4 * PAGE_SIZE + 1
    assert len(done[small.request_id].token_ids) == 3
    alone = tiny_llm(_hf(), num_pages=64).generate([1, 5, 6, 7, 8], greedy)[0].token_ids
    assert done[big.request_id].token_ids == alone[:12]
    assert engine.pages.allocator.num_used == 0
