"""Continuous batching: FCFS admission by free pages, chunked prefill, preemption by recompute.

Each step the scheduler fills a token budget: running decodes first (each needs its last token
plus the proposer's lookahead slots), then unfinished prefill chunks, then waiting requests in
arrival order. When pages run out, the most recently arrived running request is preempted: its
pages go back and it re-enters the queue's head to be recomputed from prompt + output so far.

`running` is an insertion-ordered dict used as a set, kept in arrival order, so membership,
removal and finding the youngest request cost O(1) per request rather than a scan of the batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from speculant.config import SchedulerConfig
from speculant.core import Batch, Request, RequestStatus, ScheduledSeq
from speculant.kv_cache.allocator import PageTables


class QueueFull(RuntimeError):
    """The waiting queue is at `max_waiting`; the caller should retry later."""


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        pages: PageTables,
        lookahead: Callable[[Request], int],  # extra KV slots a sampling step may write
        on_preempt: Callable[[Request], None] = lambda r: None,
    ) -> None:
        self.config, self.pages, self.lookahead, self.on_preempt = config, pages, lookahead, on_preempt
        self.waiting: deque[Request] = deque()
        self.running: dict[Request, None] = {}  # in arrival order (preemption picks the youngest)

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"waiting queue is full ({self.config.max_waiting} requests)")
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Forget a finished or aborted request and return its pages."""
        if request in self.running:
            del self.running[request]
        elif request in self.waiting:
            self.waiting.remove(request)
        self.pages.release(request.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        taken: set[Request] = set()  # requests in this step's batch
        for request in sorted(self.running, key=lambda r: r.is_prefill):  # decodes first, stable FCFS
            if request not in self.running:
                continue  # preempted while making room for an older request
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0 or not self._reserve(request, num_new, taken):
                continue
            scheduled.append(ScheduledSeq(request, num_new))
            taken.add(request)
            budget -= num_new
        self._admit(scheduled, budget)
        return Batch(scheduled)

    def schedule_ahead(self, in_flight: Mapping[Request, tuple[int, int]]) -> Batch | None:
        """The next step's batch, planned while the current one runs. `in_flight` maps each
        request of the running step to (its new tokens, the most tokens the step may append).
        A request that samples this step will decode next: its pages cover the most tokens it
        may get plus its lookahead, reserved before acceptance is known. Never preempts (the
        running step may be using any page): None when pages run short, and the caller
        schedules after the step instead. Finished requests are dropped by the caller."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        for request in sorted(self.running, key=lambda r: _prefilling(*_ahead(r, in_flight.get(r)))):  # decodes first
            computed, tokens = _ahead(request, in_flight.get(request))
            remaining = tokens - computed
            num_new = remaining if remaining == 1 else min(remaining, budget)
            if num_new == 0 or num_new > budget:
                continue
            end = computed + num_new
            slots = end + self.lookahead(request) if end == tokens else end
            if not self.pages.ensure(request.request_id, slots):
                return None
            scheduled.append(ScheduledSeq(request, num_new))
            budget -= num_new
        self._admit(scheduled, budget)
        return Batch(scheduled)

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        remaining = request.num_tokens - request.num_computed_tokens
        if not request.is_prefill:
            return remaining if remaining <= budget else 0
        return min(remaining, budget)

    def _slots_needed(self, request: Request, num_new: int) -> int:
        end = request.num_computed_tokens + num_new
        return end + self.lookahead(request) if end == request.num_tokens else end

    def _reserve(self, request: Request, num_new: int, taken: set[Request]) -> bool:
        """Make `request`'s pages cover this step, preempting the youngest requests not already
        in this step's batch (possibly `request` itself) if needed."""
        slots = self._slots_needed(request, num_new)
        while not self.pages.ensure(request.request_id, slots):
            victim = next((r for r in reversed(self.running) if r not in taken), request)
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        del self.running[request]
        self.pages.release(request.request_id)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.on_preempt(request)

    def _admit(self, scheduled: list[ScheduledSeq], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self.pages.ensure(request.request_id, self._slots_needed(request, num_new)):
                break  # FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self._add_running(request)
            scheduled.append(ScheduledSeq(request, num_new))
            budget -= num_new

    def _add_running(self, request: Request) -> None:
        """Insert in arrival order: new requests append; a readmitted preempted one re-sorts."""
        youngest = next(reversed(self.running), None)
        self.running[request] = None
        if youngest is not None and request.arrival_time < youngest.arrival_time:
            self.running = dict.fromkeys(sorted(self.running, key=lambda r: r.arrival_time))


def _ahead(request: Request, flight: tuple[int, int] | None) -> tuple[int, int]:
    """(KV length, most tokens) of `request` after the running step; `flight` is its (new
    tokens, most appended) in that step, None when it is not in it."""
    if flight is None:
        return request.num_computed_tokens, request.num_tokens
    num_new, appended = flight
    if appended:  # it samples: the KV will hold all but the last of up to tokens + appended
        return request.num_tokens + appended - 1, request.num_tokens + appended
    return request.num_computed_tokens + num_new, request.num_tokens


def _prefilling(computed: int, tokens: int) -> bool:
    """`Request.is_prefill` for a KV length and token count."""
    return computed == 0 or computed < tokens - 1
