"""`speculant bench`: every method on the same prompts, side by side step by step.

Batch size B means B requests in flight, as a server under that concurrency sees them
(continuous batching): when a request finishes, its item's next turn or the next item takes its
place at once. So a batch's throughput is not set by its slowest request. The items are cut into
chunks of WAVES x B; each chunk runs under every method at once, the engines stepping in turn,
each timed on its own clock (so machine noise hits all methods alike). A multi-turn item feeds
each user turn after the model's own answer to the previous one, in the chat template. Per
request the run records the time to first token and the gap before every later token (a step
that emits n tokens at once counts n gaps of 1/n of its time each).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

from tqdm import tqdm

from speculant.bench.datasets import Conversation
from speculant.llm import LLM, chat_prompt_ids
from speculant.sampling.params import SamplingParams


@dataclass
class ItemRun:
    """One item under one method at one batch size: all its turns."""

    item: Conversation
    token_ids: list[list[int]] = field(default_factory=list)  # [turn][n] generated tokens
    latency_s: float = 0.0  # summed over turns: submit to finish
    ttft_s: list[float] = field(default_factory=list)  # [turn]
    itl_s: list[float] = field(default_factory=list)  # gap before each token after a turn's first
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_forwards: int = 0  # steps that emitted tokens for this item (approximates its forwards)


@dataclass
class MethodRun:
    """Everything one method did at one batch size."""

    method: str
    batch_size: int
    items: list[ItemRun] = field(default_factory=list)
    wall_s: float = 0.0
    accepted_by_position: list[int] = field(default_factory=list)
    proposed_by_position: list[int] = field(default_factory=list)
    steps: int = 0  # engine steps taken
    chosen_k: Counter = field(default_factory=Counter)  # k -> requests given that k on a decode step (0: plain)
    host_stage_s: float = 0.0  # host scheduling/commit time of those steps (the engine's timeline)
    host_hidden_s: float = 0.0  # of which ran while the step worker ran forwards (overlap)


def run_suite(
    llms: dict[str, LLM],
    items: list[Conversation],
    batch_sizes: list[int],
    params: SamplingParams,
    progress: bool = True,
    rounds: int = 1,
) -> list[MethodRun]:
    """Run every method (name -> LLM) over the items at every batch size, the methods in
    lockstep (`_lockstep`). With rounds > 1 every chunk runs that many times under every method,
    the order of their steps reversed each round; each round has its own n-gram store scope (an
    output of round 1 is no draft for round 2)."""
    for llm in llms.values():  # warm-up: first-call costs stay out of the measured runs (a fresh
        # 1.5B engine's first prefill of 16 prompts took 1.7-3.5 s longer than its second: a batch's worth)
        warm = [_turn_prompt(llm, item, [], 0) for item in items[: max(batch_sizes)]]
        llm.generate(warm, SamplingParams(max_tokens=4, temperature=0))
    runs = {(m, b): MethodRun(m, b) for b in batch_sizes for m in llms}
    total = sum(len(items) for _ in batch_sizes) * len(llms) * rounds
    with tqdm(total=total, desc="bench", unit="item", disable=not progress) as bar:
        for b in batch_sizes:
            for start in range(0, len(items), WAVES * b):
                chunk = items[start : start + WAVES * b]
                for r in range(rounds):
                    order = list(llms.items()) if r % 2 == 0 else list(llms.items())[::-1]
                    scope = f"batch-{b}" + (f"/round-{r}" if r else "")
                    _lockstep([(llm, runs[method, b]) for method, llm in order], chunk, b, params, scope, bar)
    return list(runs.values())


WAVES = 4  # a chunk holds this many batches' worth of items


def _lockstep(methods: list[tuple[LLM, MethodRun]], chunk: list[Conversation], batch_size: int, params: SamplingParams,
              scope: str, bar) -> None:
    """The chunk under every method at once, one engine step of each in turn (the turn order
    reversed every pass: A B, B A, ...). Each method's time is its own steps' (and submissions'):
    side by side within a fraction of a second, so a machine whose speed drifts by 10-20% over
    tens of seconds (measured here) slows every method alike."""
    flights = [_InFlight(llm, [ItemRun(item) for item in chunk], batch_size, params, scope) for llm, _ in methods]
    before = [_counters(llm) for llm, _ in methods]
    passes = 0
    while any(f.pending for f in flights):
        for f in flights if passes % 2 == 0 else flights[::-1]:
            if f.pending:
                bar.update(f.advance())
        passes += 1
    for (llm, run), f, was in zip(methods, flights, before):
        now = _counters(llm)
        run.wall_s += f.clock
        run.items += f.runs
        run.accepted_by_position = _add(run.accepted_by_position, _sub(now.accepted, was.accepted))
        run.proposed_by_position = _add(run.proposed_by_position, _sub(now.proposed, was.proposed))
        run.steps += now.steps - was.steps
        run.chosen_k += now.chosen_k - was.chosen_k
        run.host_stage_s += now.host_s - was.host_s
        run.host_hidden_s += now.hidden_s - was.hidden_s


class _Counters(NamedTuple):
    """An engine's running totals, read before and after a chunk."""

    accepted: list[int]  # [slot] drafts accepted
    proposed: list[int]  # [slot] drafts proposed
    steps: int
    chosen_k: Counter  # k -> requests given that k
    host_s: float  # host-stage seconds
    hidden_s: float  # of which overlapped the step worker


def _counters(llm: LLM) -> _Counters:
    stats, timeline = llm.engine.stats, llm.engine.timeline
    spec = stats.spec_stats
    return _Counters(list(spec.accepted_by_position), list(spec.proposed_by_position), stats.steps, Counter(stats.chosen_k),
                     timeline.host_s, timeline.hidden_s)


class _InFlight:
    """One method's items, batch_size requests in flight: a finished turn is replaced by its
    item's next turn, else by the next item not started. `scope` names the n-gram store the
    requests share (one per batch size and round). `clock` counts only this method's own work
    (its steps, its submissions); latencies are read on it."""

    def __init__(self, llm: LLM, runs: list[ItemRun], batch_size: int, params: SamplingParams, scope: str) -> None:
        self.llm, self.runs, self.params, self.user = llm, runs, params, f"{llm.user}/{scope}"
        self.waiting = deque(runs)
        self.pending: dict[str, tuple[ItemRun, float]] = {}  # request id -> (its item, submit time)
        self.last: dict[str, float] = {}  # request id -> time of its latest tokens
        self.clock = 0.0
        start = time.perf_counter()
        while self.waiting and len(self.pending) < batch_size:
            self._submit(self.waiting.popleft(), start)
        self.clock += time.perf_counter() - start

    def _submit(self, r: ItemRun, start: float) -> None:
        prompt = _turn_prompt(self.llm, r.item, r.token_ids, len(r.token_ids))
        params = self.params if r.item.structured is None else dataclasses.replace(self.params, structured_output=r.item.structured)
        t0 = self.clock + time.perf_counter() - start
        self.pending[self.llm.engine.add_request(prompt, params, user=self.user).request_id] = (r, t0)

    def advance(self) -> int:
        """One engine step and its bookkeeping; returns the number of items it finished."""
        start = time.perf_counter()
        outs = self.llm.engine.step()
        now, done = self.clock + time.perf_counter() - start, 0
        for out in outs:
            if out.request_id not in self.pending:
                continue
            r, t0 = self.pending[out.request_id]
            n = len(out.new_token_ids)
            if n and out.request_id not in self.last:
                r.ttft_s.append(now - t0)
                r.itl_s += [0.0] * (n - 1)  # tokens that came with the first one
            elif n:
                r.itl_s += [(now - self.last[out.request_id]) / n] * n
            if n:
                r.target_forwards += 1
                self.last[out.request_id] = now
            if out.finished:
                _finish(r, out, now - t0)
                del self.pending[out.request_id]
                if len(r.token_ids) < len(r.item.turns):
                    self._submit(r, start)
                else:
                    done += 1
                    if self.waiting:
                        self._submit(self.waiting.popleft(), start)
        self.clock += time.perf_counter() - start
        return done


def _finish(r: ItemRun, out, latency_s: float) -> None:
    if out.error:
        raise RuntimeError(f"item {r.item.id}: request failed: {out.error}")
    r.latency_s += latency_s
    r.token_ids.append(list(out.token_ids))
    r.draft_tokens += out.stats.draft_tokens
    r.accepted_tokens += out.stats.accepted_tokens


def _turn_prompt(llm: LLM, item: Conversation, answers: list[list[int]], turn: int) -> list[int]:
    return turn_messages(llm.tokenizer, item, answers, turn)


def turn_messages(tokenizer, item: Conversation, answers: list[list[int]], turn: int) -> list[int]:
    """Token ids of an item's turn: the user turns so far with the model's earlier answers, in the
    chat template (raw text for completion items or a tokenizer without a template)."""
    if not item.chat or not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(item.turns[turn])
    messages = []
    for i in range(turn + 1):
        messages.append({"role": "user", "content": item.turns[i]})
        if i < turn:
            messages.append({"role": "assistant", "content": tokenizer.decode(answers[i], skip_special_tokens=True)})
    return chat_prompt_ids(tokenizer, messages)


def _sub(now: list[int], before: list[int]) -> list[int]:
    return [n - (before[i] if i < len(before) else 0) for i, n in enumerate(now)]


def _add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
