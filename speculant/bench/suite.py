"""`speculant bench`: every method on the same prompts, interleaved chunk by chunk.

Batch size B means B requests in flight, as a server under that concurrency sees them
(continuous batching): when a request finishes, its item's next turn or the next item takes its
place at once. So a batch's throughput is not set by its slowest request. The items are cut into
chunks of WAVES x B; each chunk runs under every method in turn (so machine noise hits all
methods alike). A multi-turn item feeds each user turn after the model's own answer to the
previous one, in the chat template. Per request the run records the time to first token and the
gap before every later token (a step that emits n tokens at once counts n gaps of 1/n of its
time each).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

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
    """Run every method (name -> LLM) over the items at every batch size. With rounds > 1 every
    chunk runs that many times under every method, the method order reversed each round (A B,
    B A, ...) so that a machine slowing down or speeding up over the run weighs on all methods
    alike; each round has its own n-gram store scope (an output of round 1 is no draft for round 2)."""
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
                    for method, llm in order:
                        _run_chunk(llm, chunk, b, params, runs[method, b], f"batch-{b}" + (f"/round-{r}" if r else ""))
                        bar.update(len(chunk))
    return list(runs.values())


WAVES = 4  # a chunk holds this many batches' worth of items


def _run_chunk(llm: LLM, chunk: list[Conversation], batch_size: int, params: SamplingParams, run: MethodRun, scope: str) -> None:
    spec, timeline = llm.engine.stats.spec_stats, llm.engine.timeline
    acc0, prop0 = list(spec.accepted_by_position), list(spec.proposed_by_position)
    steps0, host0, hidden0 = llm.engine.stats.steps, timeline.host_s, timeline.hidden_s
    done = [ItemRun(item) for item in chunk]
    start = time.perf_counter()
    _run_in_flight(llm, done, batch_size, params, scope)
    run.wall_s += time.perf_counter() - start
    run.items += done
    run.accepted_by_position = _add(run.accepted_by_position, _sub(spec.accepted_by_position, acc0))
    run.proposed_by_position = _add(run.proposed_by_position, _sub(spec.proposed_by_position, prop0))
    run.steps += llm.engine.stats.steps - steps0
    run.host_stage_s += timeline.host_s - host0
    run.host_hidden_s += timeline.hidden_s - hidden0


def _run_in_flight(llm: LLM, runs: list[ItemRun], batch_size: int, params: SamplingParams, scope: str) -> None:
    """Every turn of every item, batch_size requests in flight: a finished turn is replaced by
    its item's next turn, else by the next item not started. `scope` names the n-gram store the
    requests share (one per batch size and round)."""
    engine, waiting = llm.engine, deque(runs)
    pending: dict[str, tuple[ItemRun, float]] = {}  # request id -> (its item, submit time)
    last: dict[str, float] = {}  # request id -> time of its latest tokens

    def submit(r: ItemRun) -> None:
        prompt = _turn_prompt(llm, r.item, r.token_ids, len(r.token_ids))
        pending[engine.add_request(prompt, params, user=f"{llm.user}/{scope}").request_id] = (r, time.perf_counter())

    while waiting and len(pending) < batch_size:
        submit(waiting.popleft())
    while pending:
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.request_id not in pending:
                continue
            r, t0 = pending[out.request_id]
            n = len(out.new_token_ids)
            if n and out.request_id not in last:
                r.ttft_s.append(now - t0)
                r.itl_s += [0.0] * (n - 1)  # tokens that came with the first one
            elif n:
                r.itl_s += [(now - last[out.request_id]) / n] * n
            if n:
                r.target_forwards += 1
                last[out.request_id] = now
            if out.finished:
                _finish(r, out, now - t0)
                del pending[out.request_id]
                if len(r.token_ids) < len(r.item.turns):
                    submit(r)
                elif waiting:
                    submit(waiting.popleft())


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
