"""Running the app under uvicorn with a graceful drain on SIGTERM / SIGINT.

uvicorn's shutdown closes the listening socket, waits for open connections, then runs the app's
lifespan shutdown. Streams stay open until their requests finish, so the drain must start
*before* that wait: `DrainingServer.shutdown` first tells the engine to stop admitting and to
abort whatever is unfinished after `drain_timeout_s`, which lets every connection end in time.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

from speculant.config import EngineConfig
from speculant.server.app import create_app
from speculant.server.async_engine import AsyncEngine

_BACKSTOP_S = 5.0  # uvicorn cancels connections this long after the drain deadline


class DrainingServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, async_engine: AsyncEngine, drain_timeout_s: float
    ) -> None:
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout_s = drain_timeout_s

    async def shutdown(self, sockets=None) -> None:
        self.async_engine.begin_shutdown(self.drain_timeout_s)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, without re-raising the signal afterwards: a drained server exits 0."""
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
                signal.signal(sig, handler)


def build_server(
    async_engine: AsyncEngine,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_timeout_s: float = 30.0,
    log_level: str = "info",
) -> DrainingServer:
    app = create_app(async_engine, model_name, drain_timeout_s)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=drain_timeout_s + _BACKSTOP_S,
    )
    return DrainingServer(config, async_engine, drain_timeout_s)


def run_server(
    engine_config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    checkpoint=None,
    draft_checkpoint=None,
    drain_timeout_s: float = 30.0,
    log_level: str = "info",
) -> None:
    """Load the model, serve it until SIGTERM/SIGINT, drain, return."""
    from speculant.engine.engine import Engine

    engine = Engine(engine_config, checkpoint=checkpoint, draft_checkpoint=draft_checkpoint)
    server = build_server(
        AsyncEngine(engine),
        model_name or engine_config.model.model,
        host,
        port,
        drain_timeout_s,
        log_level,
    )
    server.run()
