"""`Scheduler.schedule_ahead`: the next batch planned from what is known while a step runs."""

from __future__ import annotations

from speculant.config import SchedulerConfig
from speculant.core import Request, RequestStatus
from speculant.kv_cache.allocator import PageAllocator, PageTables
from speculant.sampling.params import SamplingParams
from speculant.scheduler.scheduler import Scheduler

PAGE = 4


def decoding(request_id: str, num_tokens: int) -> Request:
    r = Request(request_id, list(range(3, 3 + num_tokens)), SamplingParams())
    r.status, r.num_computed_tokens = RequestStatus.RUNNING, num_tokens - 1
    return r


def scheduler(num_pages: int, lookahead: int = 2) -> Scheduler:
    pages = PageTables(PageAllocator(num_pages), PAGE)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64), pages, lambda r: lookahead)


def test_sampling_requests_get_pages_for_the_most_they_may_emit():
    s = scheduler(num_pages=32)
    a, b = decoding("a", 10), decoding("b", 7)
    for r in (a, b):
        s.running[r] = None
        s.pages.ensure(r.request_id, r.num_tokens + 2)
    batch = s.schedule_ahead({a: (1, 4), b: (1, 1)})  # a verifies 3 drafts, b decodes plainly
    assert [(x.request, x.num_new_tokens) for x in batch.seqs] == [(a, 1), (b, 1)]
    assert len(s.pages.table("a")) == s.pages.pages_for(10 + 4 + 2)
    assert len(s.pages.table("b")) == s.pages.pages_for(7 + 1 + 2)


def test_a_prefill_chunk_continues_where_the_running_chunk_ends():
    s = scheduler(num_pages=32)
    r = Request("p", list(range(3, 43)), SamplingParams())  # 40 prompt tokens
    s.add(r)
    first = s.schedule()  # admits it: a 40-token chunk fits the budget of 64
    assert first.seqs[0].num_new_tokens == 40
    ahead = s.schedule_ahead({r: (40, 1)})  # the chunk ends the prompt: it samples, then decodes
    assert [(x.request, x.num_new_tokens) for x in ahead.seqs] == [(r, 1)]


def test_never_preempts_and_gives_up_when_pages_run_short():
    s = scheduler(num_pages=4)  # 16 slots
    a, b = decoding("a", 6), decoding("b", 5)
    for r in (a, b):
        s.running[r] = None
        assert s.pages.ensure(r.request_id, r.num_tokens + 2)
    assert s.schedule_ahead({a: (1, 5), b: (1, 5)}) is None
    assert list(s.running) == [a, b] and "a" in s.pages and "b" in s.pages
