"""Delivering a request's deltas over HTTP: as server-sent events, or gathered into one body.

Either way a client that goes away aborts its request, so its KV pages return at once: a
streaming response aborts when the response ends unfinished (Starlette cancels it on
disconnect), a plain one watches the connection while it waits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from speculant.server.request_stream import EngineFailed, RequestStream
from speculant.server.responses import ChatFormatter, Collected, CompletionFormatter

Formatter = CompletionFormatter | ChatFormatter


class SSEResponse(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def sse(payload: BaseModel | dict) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


async def sse_events(
    stream: RequestStream, formatter: Formatter, include_usage: bool
) -> AsyncIterator[str]:
    first = formatter.first_chunk()
    if first is not None:
        yield sse(first)
    try:
        async for delta in stream:
            yield sse(formatter.chunk(delta))
            if delta.output.finished and include_usage:
                yield sse(formatter.usage_chunk(delta.output))
            if delta.output.error is not None:  # the engine failed this request alone
                yield error_event(delta.output.error)
    except EngineFailed as exc:
        yield error_event(str(exc))
    yield "data: [DONE]\n\n"


def error_event(message: str) -> str:
    """Headers are gone already; OpenAI clients raise on an `error` event."""
    error = {"message": message, "type": "server_error", "param": None, "code": "engine_error"}
    return sse({"error": error})


async def collect(stream: RequestStream, request: Request) -> Collected | None:
    """All of a request's deltas, or None if the client disconnected first."""
    results = await collect_all([stream], request)
    return None if results is None else results[0]


async def collect_all(streams: list[RequestStream], request: Request) -> list[Collected] | None:
    """All deltas of every stream (the choices of one response), or None if the client
    disconnected first."""
    gather = asyncio.ensure_future(asyncio.gather(*(_gather(s) for s in streams)))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({gather, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not gather.done():
            gather.cancel()
    return gather.result() if gather.done() and not gather.cancelled() else None


async def _gather(stream: RequestStream) -> Collected:
    result = Collected()
    async for delta in stream:
        result.add(delta)
    return result


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
