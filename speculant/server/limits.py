"""What a connection may cost before the app sees it: time to send its head, size and time of
its body.

`BodyLimit` (ASGI middleware) reads each request body up to `max_bytes` within `timeout_s` and
hands it on whole; a larger body is a 413 and a slower one a 408, before any parsing or
tokenization. `timed_h11_protocol` closes connections whose request head does not arrive in time:
idle ones that never send a request, and slow-header ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from speculant.server.errors import APIError


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, timeout_s: float, record_error: Callable[[str], None]
    ) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s
        self.record_error = record_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            if _declared_length(scope) > self.max_bytes:
                raise _TooLarge
            first = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except _TooLarge:
            await self._refuse(scope, receive, send, 413, f"the request body is larger than {self.max_bytes} bytes", "body_too_large")
            return
        except TimeoutError:
            await self._refuse(scope, receive, send, 408, f"the request body did not arrive within {self.timeout_s:g} s", "body_timeout")
            return
        await self.app(scope, _replay(first, receive), send)

    async def _read(self, receive: Receive) -> Message:
        """The whole body as one `http.request` message (or the disconnect that cut it short)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                raise _TooLarge
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str, code: str) -> None:
        self.record_error(code)
        # The rest of the body is never read, so the connection cannot carry another request.
        error = APIError(status, message, code=code, headers={"Connection": "close"})
        await error.response()(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # h11 refuses a malformed length before the app runs
    return 0


def _replay(first: Message, receive: Receive) -> Receive:
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def timed_h11_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head takes over the timeout
    (counted from the connection's start or its previous response)."""

    class TimedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a request head arrived
                self._disarm_head_timer()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol
