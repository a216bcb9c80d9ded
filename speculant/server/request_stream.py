"""What a request's consumer on the event loop sees: a stream of deltas, or an exception.

The engine thread fills a `RequestStream` (through `loop.call_soon_threadsafe`); the HTTP handler
iterates it until the finishing delta.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from speculant.core import RequestOutput


class ShuttingDown(RuntimeError):
    """The server is draining and admits no new requests."""


class EngineFailed(RuntimeError):
    """`engine.step()` raised; the requests in flight were aborted."""


class EngineDead(EngineFailed):
    """The engine can run no more forwards (`ExecutorFailed`: a tensor-parallel worker died or
    hung); the server stops and exits non-zero."""


@dataclass(frozen=True)
class Chat:
    """A chat prompt, rendered with the model's chat template by the `PromptEncoder`."""

    messages: list[dict]
    tools: list[dict] | None = None  # the request's tools, for templates that render them


@dataclass
class Delta:
    """One step's news for one request."""

    output: RequestOutput
    logprobs: list[float] | None = None  # [len(output.new_token_ids)] when the request asked
    token_bytes: list[bytes] | None = None  # [len(output.new_token_ids)] each token's own bytes
    top_logprobs: list[list[tuple[bytes, float]]] | None = None  # [len(new_token_ids)][n] alternatives


class RequestStream:
    """The deltas of one request, consumed on the event loop."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        self._queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()

    def put(self, item: Delta | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[Delta]:
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.output.finished
            yield item
