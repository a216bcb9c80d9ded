"""Graceful shutdown: stop admitting, let streams finish until a deadline, abort the rest, exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from server_helpers import MODEL, engine_config, free_port, serve

LONG = {
    "model": MODEL,
    "prompt": "Tell me everything.",
    "max_tokens": 900,
    "temperature": 0,
    "ignore_eos": True,
}


class StreamReader(threading.Thread):
    """Reads one streaming completion on a thread; `started` is set at the first token."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body = (
            url,
            {**body, "stream": True, "stream_options": {"include_usage": True}},
        )
        self.started = threading.Event()
        self.events: list[dict] = []
        self.done = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/completions", json=self.body, timeout=60
            ) as response:
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        self.events.append(json.loads(line[6:]))
                        self.started.set()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.started.set()

    @property
    def finish_reason(self) -> str | None:
        reasons = [e["choices"][0]["finish_reason"] for e in self.events if e["choices"]]
        return reasons[-1] if reasons else None

    def finish(self, timeout_s: float = 30.0) -> None:
        self.join(timeout_s)
        assert not self.is_alive(), "the stream hangs"
        assert self.error is None, self.error
        assert self.done, "the stream ended without [DONE]"


def test_shutdown_aborts_a_stream_past_the_drain_deadline(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config(), drain_timeout_s=0.5) as running:
        reader = StreamReader(running.url, LONG)
        reader.start()
        assert reader.started.wait(30)
        running.server.should_exit = True
        reader.finish()
        assert reader.finish_reason == "abort"
        assert 0 < reader.events[-1]["usage"]["completion_tokens"] < LONG["max_tokens"]
        running.thread.join(15)
        assert not running.thread.is_alive(), "the server did not exit"
        assert not running.async_engine._thread.is_alive(), "the engine thread did not exit"
        assert running.async_engine.engine.pages.allocator.num_used == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{running.url}/health", timeout=5)


def test_draining_refuses_new_requests_and_finishes_in_flight_ones(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config(), drain_timeout_s=30) as running:
        reader = StreamReader(running.url, {**LONG, "max_tokens": 60})
        reader.start()
        assert reader.started.wait(30)
        running.async_engine.begin_shutdown(30)
        refused = httpx.post(
            f"{running.url}/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=10
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert httpx.get(f"{running.url}/health", timeout=10).status_code == 503
        running.server.should_exit = True
        reader.finish()
        assert reader.finish_reason == "length"
        assert reader.events[-1]["usage"]["completion_tokens"] == 60
        running.thread.join(15)
        assert not running.thread.is_alive()


SERVE_SCRIPT = """
import sys
from speculant.config import CacheConfig, EngineConfig, ModelConfig
from speculant.server import ServerOptions, run_server
config = EngineConfig(model=ModelConfig(model=sys.argv[1]), cache=CacheConfig(page_size=16, num_pages=256))
options = ServerOptions(drain_timeout_s=float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
run_server(config, "127.0.0.1", int(sys.argv[2]), model_name="tiny-smol", options=options, log_level="warning")
print("server exited", flush=True)
"""


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tiny_model, smol_tokenizer):
    """The tiny model and tokenizer as a Hugging Face folder, which a new process can load."""
    folder = tmp_path_factory.mktemp("tiny-smol")
    tiny_model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return folder


@contextmanager
def serve_process(tiny_folder, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`speculant serve` on the tiny model in its own process: (url, process); killed if still up."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(tiny_folder), str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not come up")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_sigterm_drains_and_exits_cleanly(tiny_folder):
    with serve_process(tiny_folder) as (url, proc):
        reader = StreamReader(url, LONG)
        reader.start()
        assert reader.started.wait(30)
        proc.send_signal(signal.SIGTERM)
        reader.finish()
        assert reader.finish_reason == "abort"
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, output
        assert "server exited" in output


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_cuts_the_drain_short_and_every_stream_still_ends(tiny_folder, second):
    """Two signals during ten long streams: each stream ends with an `abort` finish and
    `[DONE]`, the process exits 0."""
    with serve_process(tiny_folder, "60") as (url, proc):
        readers = [StreamReader(url, LONG) for _ in range(10)]
        for reader in readers:
            reader.start()
        assert all(reader.started.wait(60) for reader in readers)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while _healthy(url):  # the drain has begun once /health stops saying ok
            assert time.monotonic() < deadline, "not draining"
            time.sleep(0.05)
        proc.send_signal(second)
        for reader in readers:
            reader.finish(60)
            assert reader.finish_reason == "abort"
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "server exited" in output and "terminate called" not in output


def test_signals_that_keep_coming_until_the_process_exits_still_give_exit_0(tiny_folder):
    """A signal can land anywhere in the exit, even after the drain, during interpreter shutdown."""
    with serve_process(tiny_folder) as (url, proc):
        deadline = time.monotonic() + 60
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the server does not exit"
            proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, output
        assert "server exited" in output and "Traceback" not in output
