"""Victim streams: requests that run while something hostile happens, then are compared with
the text each gets alone."""

from __future__ import annotations

import asyncio

import httpx
from server_helpers import MODEL, StreamResult, stream_sse

VICTIMS = [
    {"model": MODEL, "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    for p in ("Once upon a time", "The quick brown fox", "1, 2, 3,", "def main():")
]


def text_of(result: StreamResult) -> str:
    return "".join(c.get("text", "") for c in result.choices)


def alone(url: str) -> list[str]:
    """Each victim's text when it runs by itself."""
    texts = []
    for body in VICTIMS:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    return texts


async def run_with_victims(url: str, hostile, started_tokens: int = 2) -> tuple[list[StreamResult], object]:
    """Start the victim streams, run `hostile(client)` once each has streamed a few tokens,
    and return (victim results, what `hostile` returned)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        progress = [asyncio.Event() for _ in VICTIMS]

        async def victim(i: int) -> StreamResult:
            return await stream_sse(client, "/v1/completions", VICTIMS[i], on_event=lambda n: n >= started_tokens and progress[i].set())

        tasks = [asyncio.create_task(victim(i)) for i in range(len(VICTIMS))]
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in progress)), 60)
        outcome = await hostile(client)
        return list(await asyncio.gather(*tasks)), outcome


def assert_unharmed(results: list[StreamResult], expected: list[str]) -> None:
    for result, text in zip(results, expected, strict=True):
        assert result.status == 200 and result.done, result.events[-1:]
        assert not any("error" in e for e in result.events), result.events[-1:]
        assert result.choices[-1]["finish_reason"] == "length"
        assert text_of(result) == text
