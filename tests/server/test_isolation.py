"""One request never hurts another: values the tensors cannot hold, a row that fails inside a
step, and work (tokenizing, huge bodies) that must stay off the engine thread."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_helpers import MODEL, engine_config, serve
from victims import alone, assert_unharmed, run_with_victims

OVERFLOW = 9223372036854775808  # 2**63: one past int64


@pytest.mark.parametrize("kind", ["server", "ngram_server"])
@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "top_k": OVERFLOW}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "top_k": OVERFLOW}),
    ],
    ids=["completions", "chat"],
)
def test_an_int64_overflow_is_a_400_and_streams_in_flight_continue(request, kind, path, body):
    running = request.getfixturevalue(kind)
    expected = alone(running.url)

    async def hostile(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(path, json={"model": MODEL, **body})

    results, response = asyncio.run(run_with_victims(running.url, hostile))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "top_k"
    assert_unharmed(results, expected)


def test_a_row_that_fails_inside_a_step_aborts_only_its_request(tiny_checkpoint, monkeypatch):
    """A fault injected into one request's sampling row: that request ends with an error, the
    streams sharing its batch finish with the text they get alone."""
    import speculant.engine.sampling_rows as sampling_rows

    marker = 4242  # the seed that singles out the faulty request
    real_row = sampling_rows.sampling_row

    def faulty_row(req, device):
        if req.params.seed == marker:
            raise OverflowError("injected fault in this row")
        return real_row(req, device)

    with serve(tiny_checkpoint, engine_config()) as running:
        expected = alone(running.url)
        monkeypatch.setattr(sampling_rows, "sampling_row", faulty_row)
        faulty = {"model": MODEL, "prompt": "Hi", "max_tokens": 8, "seed": marker}

        async def hostile(client: httpx.AsyncClient):
            plain = await client.post("/v1/completions", json=faulty)
            async with client.stream("POST", "/v1/completions", json={**faulty, "stream": True}) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            return plain, lines

        results, (plain, lines) = asyncio.run(run_with_victims(running.url, hostile))
        assert_unharmed(results, expected)
        assert plain.status_code == 500 and "injected fault" in plain.json()["error"]["message"]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert "injected fault" in events[-1]["error"]["message"]
        finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
        assert finish[-1] == "error"
        metrics = running.wait_for_metric("speculant_kv_pages_used", 0.0)
        assert metrics["speculant_kv_pages_used"] == 0


def test_a_huge_body_is_a_413_before_any_tokenizing(server):
    body = json.dumps({"model": MODEL, "prompt": "word " * 2_000_000, "max_tokens": 1})  # 10 MB
    response = httpx.post(
        f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    assert response.status_code == 413, response.text[:200]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "body_too_large"


def test_a_long_prompt_is_tokenized_off_the_engine_thread(server):
    """While a 2 MB prompt is being tokenized (seconds), a short request is admitted and
    finishes first: the engine thread never tokenizes."""
    big = {"model": MODEL, "prompt": "hello world " * 170_000, "max_tokens": 1}
    small = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    finished: list[str] = []

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

            async def post(name: str, body: dict, delay_s: float) -> httpx.Response:
                await asyncio.sleep(delay_s)
                response = await client.post("/v1/completions", json=body)
                finished.append(name)
                return response

            return await asyncio.gather(post("big", big, 0.0), post("small", small, 0.5))

    big_response, small_response = asyncio.run(both())
    assert big_response.status_code == 400 and big_response.json()["error"]["param"] == "prompt"
    assert small_response.status_code == 200
    assert finished == ["small", "big"]
