"""Running the app under uvicorn with a graceful drain on SIGTERM / SIGINT.

Any number of SIGTERM/SIGINT gives the same drain: stop admitting, let in-flight requests finish
for `drain_timeout_s`, abort the rest (their streams end with finish_reason "abort" and
`[DONE]`), stop the engine thread, exit 0. A repeated signal moves the abort to now; it never
kills the process under its streams. The listening socket stays open until the in-flight
requests have ended, so `/health` answers 503 and new requests get a 503 meanwhile; then
uvicorn's own shutdown closes it, waits for the last responses and runs the app's lifespan exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

from speculant.config import EngineConfig
from speculant.server.app import create_app
from speculant.server.async_engine import AsyncEngine
from speculant.server.limits import timed_h11_protocol
from speculant.server.options import ServerOptions

_BACKSTOP_S = 5.0  # uvicorn cancels connections this long after the drain deadline
_POLL_S = 0.05


class DrainingServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, async_engine: AsyncEngine, drain_timeout_s: float
    ) -> None:
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout_s = drain_timeout_s
        self.hurry = False  # a signal came during the drain: abort what is left now
        self.signalled = False  # a signal stopped the server

    def handle_exit(self, sig: int, frame) -> None:
        """Runs in the signal handler: set flags only (the event loop acts on them)."""
        self.signalled = True
        if self.should_exit:
            self.hurry = True
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.async_engine.fatal is not None:  # the engine is gone: stop serving
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        self.async_engine.begin_shutdown(self.drain_timeout_s)
        while self.async_engine.in_flight:  # still listening: /health says 503
            if self.hurry:
                self.async_engine.hasten_shutdown()
            await asyncio.sleep(_POLL_S)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, without re-raising the signal afterwards: a drained server exits 0.
        When a signal stopped the server, SIGINT and SIGTERM are ignored from then on: the
        process is on its way out, and a late signal (even during interpreter shutdown, which
        resets Python-level handlers but keeps SIG_IGN) must not kill a cleanly drained exit."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_IGN if self.signalled else handler)


def build_server(
    async_engine: AsyncEngine,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    options: ServerOptions | None = None,
    log_level: str = "info",
) -> DrainingServer:
    options = options or ServerOptions()
    app = create_app(async_engine, model_name, options)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=timed_h11_protocol(options.header_timeout_s),
        limit_concurrency=options.max_connections,
        timeout_graceful_shutdown=options.drain_timeout_s + _BACKSTOP_S,
    )
    return DrainingServer(config, async_engine, options.drain_timeout_s)


def run_server(
    engine_config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    checkpoint=None,
    draft_checkpoint=None,
    options: ServerOptions | None = None,
    log_level: str = "info",
) -> int:
    """Load the model, serve it until SIGTERM/SIGINT, drain; the exit status: 0, or 1 when the
    engine failed for good (a tensor-parallel worker died or hung)."""
    from speculant.engine.engine import Engine

    engine = Engine(engine_config, checkpoint=checkpoint, draft_checkpoint=draft_checkpoint)
    async_engine = AsyncEngine(engine)
    server = build_server(
        async_engine, model_name or engine_config.model.model, host, port, options, log_level
    )
    try:
        server.run()
    finally:
        engine.close()
    return 0 if async_engine.fatal is None else 1
