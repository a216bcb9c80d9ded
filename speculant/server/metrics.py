"""Prometheus metrics of one server, in their own registry (tests build several apps).

Token and speculation counters advance by the deltas of `engine.stats` after every step, on the
engine thread, so they agree exactly with the per-request `speculation` objects. Derived figures:

    acceptance rate = spec_accepted_tokens_total / spec_draft_tokens_total
    acceptance at position i = spec_accepted_by_position_total{position=i}
                               / spec_proposed_by_position_total{position=i}
    tau = 1 + spec_accepted_tokens_total / spec_draft_steps_total
          (tokens per verifying target forward, bonus included: `SpecStats.tau`)
    tokens per target forward, all forwards = emitted_tokens_total / target_forwards_total
    mean k chosen = sum_k k * spec_chosen_k_total{k} / sum_k spec_chosen_k_total{k}
                    (per request and decode step; k = 0 is plain decoding, as adaptive k may choose)
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from speculant.core import RequestOutput

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_SPEC_SCALARS = (
    "draft_steps",
    "draft_tokens",
    "accepted_tokens",
    "target_forwards",
    "emitted_tokens",
)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._build_request_metrics()
        self._build_engine_metrics()
        self._build_spec_metrics()
        self._seen = _Snapshot()
        self._timing: dict[str, list[float]] = {}  # request id -> [submitted, last token time]

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, registry=self.registry)

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(name, doc, buckets=_LATENCY_BUCKETS, registry=self.registry)

    def _build_request_metrics(self) -> None:
        self.requests = self._counter(
            "speculant_requests",
            "Requests by outcome: a finish reason (stop/length/abort) or an error code",
            ("outcome",),
        )
        self.ttft = self._histogram(
            "speculant_time_to_first_token_seconds", "Submission to first generated token"
        )
        self.itl = self._histogram(
            "speculant_inter_token_latency_seconds",
            "Gap between tokens, shared by the tokens one step emits",
        )
        self.latency = self._histogram("speculant_request_latency_seconds", "Submission to finish")

    def _build_engine_metrics(self) -> None:
        self.waiting = self._gauge(
            "speculant_requests_waiting", "Requests in the scheduler's waiting queue"
        )
        self.running = self._gauge(
            "speculant_requests_running", "Requests the scheduler is running"
        )
        self.kv_used = self._gauge(
            "speculant_kv_pages_used", "KV cache pages allocated to requests"
        )
        self.kv_free = self._gauge("speculant_kv_pages_free", "KV cache pages free")
        self.kv_total = self._gauge("speculant_kv_pages_total", "KV cache pages in all")
        self.memory_plan = Gauge(
            "speculant_memory_plan_bytes",
            "The engine's memory plan: bytes by item (weights, KV cache, workspaces) and total",
            ("item",),
            registry=self.registry,
        )
        self.prompt_tokens = self._counter(
            "speculant_prompt_tokens", "Prompt tokens of finished requests"
        )
        self.generation_tokens = self._counter("speculant_generation_tokens", "Tokens generated")

    def _build_spec_metrics(self) -> None:
        self.spec = {
            "draft_steps": self._counter(
                "speculant_spec_draft_steps", "Speculative steps (one proposal verified)"
            ),
            "draft_tokens": self._counter("speculant_spec_draft_tokens", "Draft tokens proposed"),
            "accepted_tokens": self._counter(
                "speculant_spec_accepted_tokens", "Draft tokens the target accepted"
            ),
            "target_forwards": self._counter(
                "speculant_target_forwards", "Per-request target forwards that emitted tokens"
            ),
            "emitted_tokens": self._counter(
                "speculant_emitted_tokens", "Tokens those forwards emitted, bonus included"
            ),
        }
        self.accepted_by_position = self._counter(
            "speculant_spec_accepted_by_position",
            "Draft tokens accepted at draft slot `position`",
            ("position",),
        )
        self.proposed_by_position = self._counter(
            "speculant_spec_proposed_by_position",
            "Draft tokens proposed at draft slot `position`",
            ("position",),
        )
        self.chosen_k = self._counter(
            "speculant_spec_chosen_k", "Requests given speculation length `k` on a decode step", ("k",)
        )

    def declare_positions(self, k: int) -> None:
        """Show draft slots 0..k-1 at zero before the first proposal (per-request k may add more)."""
        for position in range(k):
            self.accepted_by_position.labels(position=str(position))
            self.proposed_by_position.labels(position=str(position))

    # ---- event-loop side ------------------------------------------------------------------

    def record_error(self, code: str) -> None:
        self.requests.labels(outcome=code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- engine thread --------------------------------------------------------------------

    def request_admitted(self, request_id: str, submitted_at: float) -> None:
        self._timing[request_id] = [submitted_at, submitted_at]

    def record_step(self, engine, outputs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        for out in outputs:
            self._record_timing(out, now)
        self._record_engine_deltas(engine)
        self.update_engine_gauges(engine)

    def _record_timing(self, out: RequestOutput, now: float) -> None:
        timing = self._timing.get(out.request_id)
        if timing is None:
            return
        submitted, last = timing
        n = len(out.new_token_ids)
        if n and len(out.token_ids) == n:
            self.ttft.observe(now - submitted)
        elif n:
            for _ in range(n):
                self.itl.observe((now - last) / n)
        if n:
            timing[1] = now
        if out.finished:
            del self._timing[out.request_id]
            self.latency.observe(now - submitted)
            self.requests.labels(outcome=out.finish_reason or "unknown").inc()

    def _record_engine_deltas(self, engine) -> None:
        current = _Snapshot.of(engine.stats)
        self.prompt_tokens.inc(current.prompt_tokens - self._seen.prompt_tokens)
        self.generation_tokens.inc(current.generated_tokens - self._seen.generated_tokens)
        for name, counter in self.spec.items():
            counter.inc(current.spec[name] - self._seen.spec.get(name, 0))
        _inc_by_position(
            self.accepted_by_position, current.accepted_by_position, self._seen.accepted_by_position
        )
        _inc_by_position(
            self.proposed_by_position, current.proposed_by_position, self._seen.proposed_by_position
        )
        for k, n in current.chosen_k.items():
            delta = n - self._seen.chosen_k.get(k, 0)
            if delta:
                self.chosen_k.labels(k=str(k)).inc(delta)
        self._seen = current

    def update_engine_gauges(self, engine) -> None:
        self.waiting.set(len(engine.scheduler.waiting))
        self.running.set(len(engine.scheduler.running))
        self.kv_used.set(engine.pages.allocator.num_used)
        self.kv_free.set(engine.pages.allocator.num_free)
        self.kv_total.set(engine.num_pages)
        for item, value in engine.memory.as_dict().items():
            self.memory_plan.labels(item=item).set(value)


class _Snapshot:
    """The cumulative engine counters at the last update."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.spec: dict[str, int] = {}
        self.accepted_by_position: list[int] = []
        self.proposed_by_position: list[int] = []
        self.chosen_k: dict[int, int] = {}

    @classmethod
    def of(cls, stats) -> _Snapshot:
        snap = cls()
        snap.prompt_tokens = stats.prompt_tokens
        snap.generated_tokens = stats.generated_tokens
        snap.spec = {name: getattr(stats.spec_stats, name) for name in _SPEC_SCALARS}
        snap.accepted_by_position = list(stats.spec_stats.accepted_by_position)
        snap.proposed_by_position = list(stats.spec_stats.proposed_by_position)
        snap.chosen_k = dict(stats.chosen_k)
        return snap


def _inc_by_position(counter: Counter, current: list[int], seen: list[int]) -> None:
    for position, value in enumerate(current):
        delta = value - (seen[position] if position < len(seen) else 0)
        if delta:
            counter.labels(position=str(position)).inc(delta)
