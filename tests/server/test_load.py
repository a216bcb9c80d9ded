"""Many concurrent streams of mixed lengths: all complete, none lost, duplicated or cut short."""

from __future__ import annotations

import asyncio
import random

import httpx
from server_helpers import MODEL, StreamResult, stream_sse

NUM_STREAMS = 64
WORDS = "the engine schedules requests drafts tokens verifies them and commits what the target accepts".split()


def mixed_requests(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120)))
        body = {
            "model": MODEL,
            "max_tokens": rng.randint(8, 32),
            "temperature": rng.choice([0.0, 0.8]),
            "seed": i,
            "ignore_eos": i % 2 == 0,  # half run to max_tokens exactly; half may stop early
            "stream_options": {"include_usage": True},
        }
        if i % 3 == 0:
            body["messages"] = [{"role": "user", "content": prompt}]
            body["logprobs"] = True
        else:
            body["prompt"] = prompt
            body["logprobs"] = 0
        requests.append(body)
    return requests


async def run_all(url: str, requests: list[dict]) -> list[StreamResult]:
    limits = httpx.Limits(max_connections=NUM_STREAMS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(stream_sse(client, _path(body), body) for body in requests))


def _path(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def _num_tokens(choice: dict) -> int:
    logprobs = choice.get("logprobs")
    if not logprobs:
        return 0
    return len(logprobs["content"]) if "content" in logprobs else len(logprobs["tokens"])


def check_stream(body: dict, result: StreamResult) -> None:
    assert result.status == 200, result.events
    assert result.done, "stream ended without [DONE]"
    assert len({e["id"] for e in result.events}) == 1
    finishing = [c for c in result.choices if c["finish_reason"] is not None]
    assert len(finishing) == 1 and finishing[0] is result.choices[-1]
    usage = result.usage
    assert (
        usage is not None
        and sum(_num_tokens(c) for c in result.choices) == usage["completion_tokens"]
    )
    reason = finishing[0]["finish_reason"]
    if body["ignore_eos"]:
        assert reason == "length"
    assert reason in ("stop", "length")
    if reason == "length":
        assert usage["completion_tokens"] == body["max_tokens"]
    else:
        assert usage["completion_tokens"] <= body["max_tokens"]


def test_concurrent_streams_all_complete(server):
    before = server.metrics()
    requests = mixed_requests(NUM_STREAMS)
    results = asyncio.run(run_all(server.url, requests))
    for body, result in zip(requests, results, strict=True):
        check_stream(body, result)
    assert len({r.events[0]["id"] for r in results}) == NUM_STREAMS
    after = server.wait_for_metric("speculant_kv_pages_used", 0.0)
    assert after["speculant_kv_pages_used"] == 0
    assert after["speculant_requests_running"] == 0 and after["speculant_requests_waiting"] == 0
    finished = sum(
        after.get(f'speculant_requests_total{{outcome="{o}"}}', 0) for o in ("stop", "length")
    )
    finished -= sum(
        before.get(f'speculant_requests_total{{outcome="{o}"}}', 0) for o in ("stop", "length")
    )
    assert finished == NUM_STREAMS
