"""Engine-wide counters: requests, tokens, steps, time, and speculation."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from speculant.core import Batch, Request, SpecStats


@dataclass
class EngineStats:
    spec_stats: SpecStats = field(default_factory=SpecStats)
    finished: Counter = field(default_factory=Counter)  # finish reason -> requests
    generated_tokens: int = 0
    prompt_tokens: int = 0
    steps: int = 0
    speculative_steps: int = 0
    preemptions: int = 0
    busy_s: float = 0.0  # time spent inside steps
    ttft_s: list[float] = field(default_factory=list)
    chosen_k: Counter = field(default_factory=Counter)  # k -> requests given that k on a decode step
    strict_decode_steps: int = 0  # decode steps run in strict sync mode
    strict_decode_reads: int = 0  # host reads those steps made (`speculant.utils.sync`)

    @contextmanager
    def timed_step(self, batch: Batch):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.busy_s += time.perf_counter() - start
            self.steps += 1

    def record_tokens(self, n: int) -> None:
        self.generated_tokens += n
        self.spec_stats.target_forwards += 1
        self.spec_stats.emitted_tokens += n

    def record_ks(self, ks: list[int]) -> None:
        """Each request's k on a decode step of a speculating engine (0: it decoded plainly)."""
        self.chosen_k.update(ks)

    def record_decode_reads(self, reads: int) -> None:
        """A decode step in strict sync mode made `reads` host reads."""
        self.strict_decode_steps += 1
        self.strict_decode_reads += reads

    def record_finish(self, request: Request) -> None:
        self.finished[request.status.value] += 1
        self.prompt_tokens += request.num_prompt_tokens
        self.preemptions += request.num_preemptions
        if request.first_token_time is not None:
            self.ttft_s.append(request.first_token_time - request.arrival_time)

    def as_dict(self) -> dict:
        s = self.spec_stats
        return {
            "requests_finished": dict(self.finished),
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "steps": self.steps,
            "busy_s": self.busy_s,
            "tokens_per_s": self.generated_tokens / self.busy_s if self.busy_s else 0.0,
            "mean_ttft_s": sum(self.ttft_s) / len(self.ttft_s) if self.ttft_s else 0.0,
            "preemptions": self.preemptions,
            "target_forwards": s.target_forwards,
            "tau": s.tau,
            "draft_steps": s.draft_steps,
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate,
            "acceptance_by_position": s.acceptance_by_position,
            "chosen_k_histogram": dict(sorted(self.chosen_k.items())),
            "mean_chosen_k": mean_k(self.chosen_k) or 0.0,
            # mean host reads per decode step, counted in strict sync mode only (else None)
            "host_reads_per_step": self.strict_decode_reads / self.strict_decode_steps if self.strict_decode_steps else None,
        }


def mean_k(histogram: Counter) -> float | None:
    """Mean k of a k -> count histogram; None when it is empty (no decode step chose a k)."""
    n = sum(histogram.values())
    return sum(k * c for k, c in histogram.items()) / n if n else None
