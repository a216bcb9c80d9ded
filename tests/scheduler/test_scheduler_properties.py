"""The Scheduler alone, driven by a fake engine over random workloads: every batch is consistent
(pages cover what it computes, budget and seat limits hold, no preempted request in it), waiting
requests own no pages, admission is FCFS, and every request finishes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from speculant.config import SchedulerConfig
from speculant.core import Request, RequestStatus
from speculant.kv_cache.allocator import PageAllocator, PageTables
from speculant.sampling.params import SamplingParams
from speculant.scheduler.scheduler import Scheduler


@st.composite
def workloads(draw):
    page_size = draw(st.integers(1, 5))
    num_pages = draw(st.integers(2, 16))
    lookahead = draw(st.integers(0, min(2, num_pages * page_size - 2)))  # speculation's slots
    capacity = num_pages * page_size - lookahead  # every request must fit alone
    requests = []
    for _ in range(draw(st.integers(1, 10))):
        prompt = draw(st.integers(1, max(1, capacity - 1)))
        max_tokens = draw(st.integers(1, max(1, capacity - prompt)))
        requests.append((prompt, max_tokens, draw(st.integers(0, 6))))  # arrival step
    config = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=draw(st.integers(1, 12))
    )
    return page_size, num_pages, lookahead, config, requests


def _check_batch(sched: Scheduler, batch, lookahead: int, config: SchedulerConfig) -> None:
    assert sum(s.num_new_tokens for s in batch.seqs) <= config.max_num_batched_tokens
    assert len({id(s.request) for s in batch.seqs}) == len(batch.seqs)
    assert len(sched.running) <= config.max_num_seqs
    for s in batch.seqs:
        r = s.request
        assert r in sched.running and r.status is RequestStatus.RUNNING, (
            "a preempted request was scheduled"
        )
        assert s.num_new_tokens >= 1
        end = r.num_computed_tokens + s.num_new_tokens
        assert end <= r.num_tokens
        need = end + lookahead if s.samples else end
        assert len(sched.pages.table(r.request_id)) * sched.pages.page_size >= need
    for r in sched.waiting:
        assert r.request_id not in sched.pages and r.num_computed_tokens == 0
    owned = sum(len(sched.pages.table(r.request_id)) for r in sched.running)
    assert owned + sched.pages.allocator.num_free == sched.pages.allocator.num_pages


def _commit(sched: Scheduler, batch, finished: list[Request]) -> None:
    """What the engine does after a forward: advance, append a token where sampled, finish."""
    for s in batch.seqs:
        r = s.request
        samples = s.samples
        r.num_computed_tokens += s.num_new_tokens
        if samples:
            r.output_token_ids.append(len(r.output_token_ids))
        if len(r.output_token_ids) >= r.params.max_tokens:
            r.status = RequestStatus.FINISHED_LENGTH
            sched.remove(r)
            finished.append(r)
        else:
            sched.pages.shrink(r.request_id, r.num_tokens)


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_random_workloads_are_served_consistently(workload) -> None:
    page_size, num_pages, lookahead, config, specs = workload
    sched = Scheduler(config, PageTables(PageAllocator(num_pages), page_size), lambda r: lookahead)
    arrivals = sorted(range(len(specs)), key=lambda i: specs[i][2])
    requests = {
        i: Request(
            f"r{i}",
            [7] * specs[i][0],
            SamplingParams(max_tokens=specs[i][1]),
            arrival_time=float(n),
        )
        for n, i in enumerate(arrivals)
    }
    started, finished = [], []
    for step in range(2000):
        for i in arrivals:
            if specs[i][2] == step:
                sched.add(requests[i])
        batch = sched.schedule()
        _check_batch(sched, batch, lookahead, config)
        started += [s.request for s in batch.seqs if s.request not in started]
        _commit(sched, batch, finished)
        if len(finished) == len(specs):
            break
    assert len(finished) == len(specs), "some request never finished"
    assert started == sorted(started, key=lambda r: r.arrival_time), "admission is not FCFS"
    assert sched.pages.allocator.num_used == 0 and not sched.has_work
