"""The engine on its own thread, driven from asyncio.

`Engine` is not thread-safe, so one thread owns it: it takes commands (add, abort, drain, stop)
from a thread-safe queue between steps, runs `engine.step()` while there is work, and hands each
step's outputs to the event loop with `loop.call_soon_threadsafe`, which fans them out to
per-request asyncio queues. Scheduling and model forwards therefore never block the event loop.
Requests arrive as token ids (the HTTP side tokenizes, see `prompts.py`), so admitting one costs
the engine thread almost nothing; detokenizing output and logprob tokens runs on it.

Shutdown is a drain: stop admitting (callers get `ShuttingDown`), let in-flight requests finish
until a deadline, abort what is left (its streams end with finish_reason "abort"), then exit.
`hasten_shutdown` moves the deadline to now.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from speculant.core import RequestOutput
from speculant.engine.engine import Engine
from speculant.executor.errors import ExecutorFailed
from speculant.sampling.params import SamplingParams
from speculant.server.metrics import ServerMetrics
from speculant.server.request_stream import (
    Delta,
    EngineDead,
    EngineFailed,
    RequestStream,
    ShuttingDown,
)
from speculant.server.token_bytes import TokenBytes

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.05  # how often an idle engine thread checks a drain deadline


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: RequestStream
    user: str | None = None
    admitted: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    submitted_at: float = field(default_factory=time.perf_counter)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Drain:
    deadline: float  # time.monotonic() after which unfinished requests are aborted


@dataclass
class _Stop:
    pass


class AsyncEngine:
    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics or ServerMetrics()
        if engine.config.speculative.enabled:
            self.metrics.declare_positions(engine.config.speculative.num_draft_tokens)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "closed" against command submission
        self._closed = False
        self._accepting = True
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Owned by the engine thread:
        self._streams: dict[str, RequestStream] = {}
        self._token_bytes = TokenBytes(engine.tokenizer)
        self._drain_deadline: float | None = None
        self._stop = False
        self.fatal: ExecutorFailed | None = None  # set when the engine can run no more: the server exits non-zero

    # ---- event-loop side ------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.metrics.update_engine_gauges(self.engine)
        self._thread = threading.Thread(target=self._run, name="speculant-engine", daemon=True)
        self._thread.start()

    @property
    def accepting(self) -> bool:
        return self._accepting and not self._closed

    @property
    def in_flight(self) -> bool:
        """Some admitted request has not finished yet (read from the event loop)."""
        return bool(self._streams) and self._thread is not None and self._thread.is_alive()

    async def submit(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, user: str | None = None
    ) -> RequestStream:
        """Admit a request (`user` scopes cross-request state). Raises ValueError (bad input),
        QueueFull, ShuttingDown."""
        if not self.accepting or self._thread is None:
            raise ShuttingDown("the server is shutting down")
        stream = RequestStream(request_id)
        command = _Add(request_id, prompt_ids, params, stream, user)
        self._send(command)
        await asyncio.wrap_future(command.admitted)
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone); its pages return at the engine's next command check."""
        try:
            self._send(_Abort(request_id))
        except ShuttingDown:
            pass  # the engine thread is gone, and with it every request

    def begin_shutdown(self, timeout_s: float) -> None:
        """Stop admitting; abort whatever is unfinished `timeout_s` from now. Idempotent."""
        if not self._accepting:
            return
        self._accepting = False
        try:
            self._send(_Drain(time.monotonic() + timeout_s))
        except ShuttingDown:
            pass

    def hasten_shutdown(self) -> None:
        """Abort every unfinished request now (a drain already begun, cut short)."""
        self.begin_shutdown(0.0)
        try:
            self._send(_Drain(time.monotonic()))
        except ShuttingDown:
            pass

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Drain (see `begin_shutdown`), then stop and join the engine thread."""
        self.begin_shutdown(timeout_s)
        try:
            self._send(_Stop())
        except ShuttingDown:
            pass
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _send(self, command) -> None:
        with self._lock:
            if self._closed:
                raise ShuttingDown("the server is shutting down")
            self._commands.put(command)

    # ---- engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not (self._stop and not self.engine.has_unfinished()):
                self._handle_commands(block=not self.engine.has_unfinished())
                self._enforce_deadline()
                if self.engine.has_unfinished():
                    self._step()
        except Exception:
            logger.exception("the engine thread failed; the server admits no more requests")
        finally:
            self._close()

    def _handle_commands(self, block: bool) -> None:
        try:
            if not block:
                command = self._commands.get_nowait()
            else:  # idle: sleep until a command, waking only to check a drain deadline
                draining = self._drain_deadline is not None
                command = self._commands.get(timeout=_IDLE_POLL_S if draining else None)
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self.metrics.update_engine_gauges(self.engine)

    def _apply(self, command) -> None:
        if isinstance(command, _Add):
            self._add(command)
        elif isinstance(command, _Abort):
            self._abort(command.request_id)
        elif isinstance(command, _Drain):
            self._drain_deadline = command.deadline
        elif isinstance(command, _Stop):
            self._stop = True

    def _add(self, command: _Add) -> None:
        if not command.admitted.set_running_or_notify_cancel():
            return  # the client left before its request reached the engine
        try:
            self.engine.add_request(command.prompt_ids, command.params, command.request_id, command.user)
        except Exception as exc:  # ValueError, QueueFull: the handler turns them into 4xx
            command.admitted.set_exception(exc)
            return
        self._streams[command.request_id] = command.stream
        self.metrics.request_admitted(command.request_id, command.submitted_at)
        command.admitted.set_result(None)

    def _abort(self, request_id: str) -> None:
        output = self.engine.abort_request(request_id)
        if output is not None:
            self._publish([output])

    def _enforce_deadline(self) -> None:
        if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
            for request_id in list(self.engine.requests):
                self._abort(request_id)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except ExecutorFailed as exc:
            logger.error("the engine can run no more forwards; the server stops: %s", exc)
            self.fatal, self._accepting, self._stop = exc, False, True
            self._fail_all(EngineDead(f"the engine is unavailable: {exc}"))
            return
        except Exception:
            logger.exception("engine step failed; aborting the requests in flight")
            self._fail_all()
            return
        self._publish(outputs)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        self.metrics.record_step(self.engine, outputs)
        deliveries = []
        for out in outputs:
            if not (out.new_token_ids or out.new_text or out.finished):
                continue  # a prefill chunk that sampled nothing
            stream = (
                self._streams.pop(out.request_id)
                if out.finished
                else self._streams.get(out.request_id)
            )
            if stream is not None:
                deliveries.append((stream, self._delta(out)))
        if deliveries:
            self._call_soon(_deliver, deliveries)

    def _delta(self, out: RequestOutput) -> Delta:
        if out.logprobs is None:
            return Delta(out)
        new = out.new_token_ids
        logprobs = out.logprobs[len(out.logprobs) - len(new) :] if new else []
        tops = None
        if out.top_logprobs is not None:
            tops = [
                [(self._token_bytes(t), v) for t, v in row]
                for row in (out.top_logprobs[len(out.top_logprobs) - len(new) :] if new else [])
            ]
        return Delta(out, logprobs, [self._token_bytes(t) for t in new], tops)

    def _fail_all(self, error: EngineFailed | None = None) -> None:
        for request_id in list(self.engine.requests):
            try:
                self.engine.abort_request(request_id)
            except Exception:
                logger.exception("could not abort %s after a failed step", request_id)
        self.metrics.update_engine_gauges(self.engine)
        error = error or EngineFailed("the engine failed while running this request")
        failed = [(s, error) for s in self._streams.values()]
        self._streams.clear()
        self._call_soon(_deliver, failed)

    def _close(self) -> None:
        """Refuse further commands; answer the ones that raced with the stop."""
        with self._lock:
            self._closed = True
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add) and command.admitted.set_running_or_notify_cancel():
                command.admitted.set_exception(ShuttingDown("the server is shutting down"))
        if self._streams:  # only after a crash: a clean stop finishes or aborts every request
            self._call_soon(
                _deliver, [(s, EngineFailed("the engine stopped")) for s in self._streams.values()]
            )
            self._streams.clear()

    def _call_soon(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            logger.warning("event loop closed; dropped %d deliveries", len(args[0]))


def _deliver(deliveries: list[tuple[RequestStream, Delta | BaseException]]) -> None:
    for stream, item in deliveries:
        stream.put(item)
