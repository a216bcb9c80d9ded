"""Per-step timeline: what the host and the step worker did, and how much host time was hidden.

Each step records spans (stage name, thread, start, end): schedule, plan (the proposer's
choice of k), propose, each forward (`forward:<model>`), the host read, commit, and with overlap
`prepare` (scheduling the next step while this one's forwards run) and `wait` (the host waiting
for the worker). Host time is *hidden* when a host span runs between handing the device stage to
the worker and the worker finishing it: it is then off the step's critical path.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

HOST_STAGES = ("schedule", "plan", "prepare", "commit")  # host work a step could hide behind forwards


@dataclass(frozen=True)
class Span:
    name: str
    start: float  # perf_counter seconds
    end: float
    worker: bool  # ran on the step worker thread

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class StepTimeline:
    spans: list[Span] = field(default_factory=list)
    busy: tuple[float, float] | None = None  # (handed to the worker, worker done) this step

    def hidden_s(self) -> float:
        """Host-stage time that overlapped the worker's busy interval."""
        if self.busy is None:
            return 0.0
        return sum(_overlap(s, *self.busy) for s in self._host_spans())

    def host_s(self) -> float:
        """Host-stage time, less the forwards the host ran inside it (a proposer's update)."""
        stages = self._host_spans()
        forwards = [s for s in self.spans if not s.worker and s.name.startswith("forward:")]
        return sum(s.seconds for s in stages) - sum(_overlap(f, s.start, s.end) for f in forwards for s in stages)

    def _host_spans(self) -> list[Span]:
        return [s for s in self.spans if not s.worker and s.name in HOST_STAGES]


def _overlap(span: Span, lo: float, hi: float) -> float:
    return max(0.0, min(span.end, hi) - max(span.start, lo))


class Timeline:
    """The last `keep` steps' timelines, and running totals over every step."""

    def __init__(self, keep: int = 64) -> None:
        self.steps: deque[StepTimeline] = deque(maxlen=keep)
        self.host_s = 0.0  # host-stage seconds over all steps
        self.hidden_s = 0.0  # of which ran while the worker ran forwards
        self._current: StepTimeline | None = None
        self._worker = threading.local()

    def begin_step(self) -> None:
        self._current = StepTimeline()

    def end_step(self) -> None:
        step, self._current = self._current, None
        if step is not None:
            self.steps.append(step)
            self.host_s += step.host_s()
            self.hidden_s += step.hidden_s()

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._current is not None:
                self._current.spans.append(Span(name, start, time.perf_counter(), getattr(self._worker, "on", False)))

    @contextlib.contextmanager
    def worker(self, submitted: float) -> Iterator[None]:
        """The worker thread's share of the step, handed over at `submitted` (perf_counter): its
        spans are marked, and [submitted, its end] is `busy` — host work in that interval is off
        the step's critical path, whether or not the thread had woken up yet."""
        self._worker.on = True
        start = submitted
        try:
            yield
        finally:
            self._worker.on = False
            if self._current is not None:
                self._current.busy = (start, time.perf_counter())

    def as_dict(self) -> dict:
        return {"host_stage_s": self.host_s, "host_hidden_s": self.hidden_s}

    def last(self) -> list[dict]:
        """The latest step's spans, relative to its first (seconds)."""
        if not self.steps:
            return []
        spans = self.steps[-1].spans
        t0 = min(s.start for s in spans)
        return [{"stage": s.name, "start": s.start - t0, "seconds": s.seconds, "worker": s.worker} for s in spans]
