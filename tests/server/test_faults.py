"""Faults: clients hanging up, bursts beyond the queue, and bad requests of every kind."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_helpers import CONTEXT, MODEL, engine_config, serve, stream_sse

GOOD = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}


def _outcome(metrics: dict[str, float], outcome: str) -> float:
    return metrics.get(f'speculant_requests_total{{outcome="{outcome}"}}', 0.0)


def test_disconnected_streams_are_aborted_and_free_their_pages(server):
    before = server.metrics()
    body = {
        "model": MODEL,
        "prompt": "A long story:",
        "max_tokens": 800,
        "temperature": 0,
        "ignore_eos": True,
    }

    async def hang_up_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(
                *(stream_sse(client, "/v1/completions", body, stop_after=3) for _ in range(20))
            )

    results = asyncio.run(hang_up_all())
    assert all(r.status == 200 and not r.done for r in results)
    after = server.wait_for_metric("speculant_kv_pages_used", 0.0, timeout_s=10)
    assert after["speculant_kv_pages_used"] == 0 and after["speculant_requests_running"] == 0
    assert _outcome(after, "abort") - _outcome(before, "abort") == 20
    assert httpx.post(f"{server.url}/v1/completions", json=GOOD, timeout=30).status_code == 200


def test_a_client_that_times_out_on_a_plain_request_aborts_it(server):
    before = server.metrics()
    body = {
        "model": MODEL,
        "prompt": "Go on:",
        "max_tokens": 800,
        "temperature": 0,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    after = server.wait_for_metric("speculant_kv_pages_used", 0.0, timeout_s=10)
    assert after["speculant_kv_pages_used"] == 0
    assert _outcome(after, "abort") - _outcome(before, "abort") == 1


def test_burst_beyond_the_queue_gets_429_while_admitted_requests_finish(tiny_checkpoint):
    body = {
        "model": MODEL,
        "prompt": "Burst",
        "max_tokens": 32,
        "temperature": 0,
        "ignore_eos": True,
    }

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=40)
        ) as client:
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body) for _ in range(24))
            )

    with serve(tiny_checkpoint, engine_config(max_waiting=4, max_num_seqs=2)) as small:
        responses = asyncio.run(burst(small.url))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(429) >= 1 and statuses.count(200) >= 1
        for response in responses:
            if response.status_code == 429:
                assert response.headers["retry-after"] == "1"
                assert response.json()["error"]["code"] == "queue_full"
            else:
                assert response.json()["usage"]["completion_tokens"] == 32
        metrics = small.wait_for_metric("speculant_kv_pages_used", 0.0)
        assert metrics["speculant_kv_pages_used"] == 0
        assert _outcome(metrics, "queue_full") == statuses.count(429)
        assert httpx.post(f"{small.url}/v1/completions", json=GOOD, timeout=30).status_code == 200


C, X = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
LONG = list(range(10, 10 + CONTEXT + 50))

# (endpoint, body (a dict, or raw text), status, param)
BAD_REQUESTS = {
    "malformed json": (C, '{"prompt": "x",', 400, None),
    "body not an object": (C, "[1, 2]", 400, None),
    "missing prompt": (C, {"model": MODEL}, 400, "prompt"),
    "prompt wrong type": (C, {"prompt": 3}, 400, "prompt"),
    "empty prompt": (C, {"prompt": ""}, 400, "prompt"),
    "empty token list": (C, {"prompt": []}, 400, "prompt"),
    "token id out of vocab": (C, {"prompt": [5, 10**7]}, 400, "prompt"),
    "negative token id": (C, {"prompt": [5, -1]}, 400, "prompt"),
    "prompt longer than context": (C, {"prompt": LONG}, 400, "prompt"),
    "batch of prompts": (C, {"prompt": ["a", "b"]}, 400, "prompt"),
    "max_tokens as string": (C, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    "max_tokens zero": (C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens fractional": (C, {"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    "temperature negative": (C, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    "temperature too high": (C, {"prompt": "x", "temperature": 3}, 400, "temperature"),
    "top_p zero": (C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    "top_p above one": (C, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    "top_k below -1": (C, {"prompt": "x", "top_k": -2}, 400, "top_k"),
    "min_p above one": (C, {"prompt": "x", "min_p": 2}, 400, "min_p"),
    "seed negative": (C, {"prompt": "x", "seed": -1}, 400, "seed"),
    "n above 128": (C, {"prompt": "x", "n": 129}, 400, "n"),
    "empty stop string": (C, {"prompt": "x", "stop": [""]}, 400, "stop"),
    "stop wrong type": (C, {"prompt": "x", "stop": 5}, 400, "stop"),
    "logprobs above five": (C, {"prompt": "x", "logprobs": 10}, 400, "logprobs"),
    "echo unsupported": (C, {"prompt": "x", "echo": True}, 400, "echo"),
    "presence penalty out of range": (C, {"prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
    "logit_bias key not a token id": (C, {"prompt": "x", "logit_bias": {"a": 1.0}}, 400, "logit_bias"),
    "logit_bias token out of the vocabulary": (C, {"prompt": "x", "logit_bias": {"999999": 1.0}}, 400, "logit_bias"),
    "logit_bias above 100": (C, {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    "min_tokens above max_tokens": (C, {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    "repetition_penalty zero": (C, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    "stream wrong type": (C, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    "unknown model": (C, {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    "chat missing messages": (X, {"model": MODEL}, 400, "messages"),
    "chat empty messages": (X, {"messages": []}, 400, "messages"),
    "chat unknown role": (X, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    "chat content wrong type": (X, {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    "chat conversation longer than context": (
        X,
        {"messages": [{"role": "user", "content": "hi " * 1200}]},
        400,
        "messages",
    ),
    "chat max_completion_tokens zero": (
        X,
        {"messages": USER, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
    ),
    "chat logprobs wrong type": (X, {"messages": USER, "logprobs": "yes"}, 400, "logprobs"),
    "chat top_logprobs too high": (X, {"messages": USER, "top_logprobs": 30}, 400, "top_logprobs"),
    "chat unknown model": (X, {"model": "gpt-4", "messages": USER}, 404, "model"),
    "chat n above 128": (X, {"messages": USER, "n": 129}, 400, "n"),
}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_request_gets_the_right_4xx(http, case):
    path, body, status, param = BAD_REQUESTS[case]
    content = body if isinstance(body, str) else json.dumps(body)
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    good = http.post(C, json=GOOD)  # the server keeps answering
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 4


def test_bad_streaming_request_fails_before_the_stream(http):
    response = http.post(C, json={"prompt": "", "stream": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_unknown_route_is_a_404_in_openai_shape(http):
    response = http.get("/v1/nothing-here")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_errors_are_counted(server, http):
    before = _outcome(server.metrics(), "invalid_request")
    http.post(C, json={"prompt": "x", "top_p": 7})
    assert _outcome(server.metrics(), "invalid_request") == before + 1


def test_a_failing_engine_step_fails_its_requests_and_the_server_recovers(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config()) as running:
        engine = running.async_engine.engine
        real_step, calls = engine.step, []

        def failing_once():
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("injected fault")
            return real_step()

        engine.step = failing_once

        async def both():
            async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
                body = {"model": MODEL, "prompt": "x", "max_tokens": 16, "ignore_eos": True}
                return await asyncio.gather(client.post(C, json=body), stream_sse(client, C, body))

        plain, streamed = asyncio.run(both())
        assert plain.status_code in (200, 500)
        failures = [plain.status_code == 500, streamed.events[-1].get("error") is not None]
        assert any(failures), (plain.text, streamed.events[-1:])
        assert streamed.done
        assert (
            running.wait_for_metric("speculant_kv_pages_used", 0.0)["speculant_kv_pages_used"] == 0
        )
        assert httpx.post(f"{running.url}{C}", json=GOOD, timeout=30).status_code == 200
