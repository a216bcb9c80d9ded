"""Helpers of the server tests: engine configs, a uvicorn server on a thread, /metrics parsing.

A server runs on its own thread (`DrainingServer.run`), so tests talk to it over real sockets on
127.0.0.1 with the openai client and httpx.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import httpx

from speculant.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from speculant.engine.engine import Engine
from speculant.server import AsyncEngine, ServerOptions, build_server
from speculant.server.runner import DrainingServer

MODEL = "tiny-smol"
CONTEXT = 1024  # the tiny model's max_position_embeddings


def engine_config(
    speculative: SpeculativeConfig | None = None, max_waiting: int = 1024, max_num_seqs: int = 64
) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=MODEL),
        cache=CacheConfig(page_size=16, num_pages=1024),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=512, max_waiting=max_waiting
        ),
        speculative=speculative or SpeculativeConfig(),
    )


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:PORT
    server: DrainingServer
    async_engine: AsyncEngine
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=10).text)

    def wait_for_metric(self, name: str, value: float, timeout_s: float = 20.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = self.metrics()
            if metrics.get(name) == value or time.monotonic() > deadline:
                return metrics
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve(
    checkpoint,
    config: EngineConfig,
    drain_timeout_s: float = 5.0,
    draft_checkpoint=None,
    options: ServerOptions | None = None,
) -> Iterator[RunningServer]:
    engine = Engine(config, checkpoint=checkpoint, draft_checkpoint=draft_checkpoint)
    async_engine = AsyncEngine(engine)
    port = free_port()
    options = replace(options or ServerOptions(), drain_timeout_s=drain_timeout_s)
    server = build_server(async_engine, MODEL, port=port, options=options, log_level="warning")
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    running = RunningServer(f"http://127.0.0.1:{port}", server, async_engine, thread)
    try:
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=30)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} (labels exactly as rendered)."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


@dataclass
class StreamResult:
    status: int
    events: list[dict]  # parsed `data:` payloads, [DONE] excluded
    done: bool  # the stream ended with `data: [DONE]`
    headers: dict[str, str]

    @property
    def choices(self) -> list[dict]:
        return [e["choices"][0] for e in self.events if e.get("choices")]

    @property
    def usage(self) -> dict | None:
        return self.events[-1].get("usage") if self.events else None


async def stream_sse(
    client: httpx.AsyncClient,
    path: str,
    body: dict,
    stop_after: int | None = None,
    on_event=None,
) -> StreamResult:
    """POST a streaming request and read its events; `stop_after` events, hang up instead.
    `on_event(n)` is called with the number of events read so far."""
    events, done = [], False
    async with client.stream("POST", path, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return StreamResult(
                response.status_code, [response.json()], False, dict(response.headers)
            )
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            events.append(json.loads(line[len("data: ") :]))
            if on_event is not None:
                on_event(len(events))
            if stop_after is not None and len(events) >= stop_after:
                break  # leaving the block closes the connection mid-stream
    return StreamResult(200, events, done, dict(response.headers))
