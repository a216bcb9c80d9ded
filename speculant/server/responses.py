"""Engine deltas -> OpenAI response bodies and stream chunks, for both endpoints.

A formatter knows one request's id, model and options; `chunk()` turns one `Delta` into a stream
chunk, `response()` turns the collected deltas into a whole response. The chunk that carries the
finish reason also carries the `speculation` extension; with `stream_options.include_usage` one
more chunk follows with empty choices and the usage, as in the OpenAI API.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field

from speculant.core import CompletionStats, RequestOutput
from speculant.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Speculation,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from speculant.server.request_stream import Delta
from speculant.server.token_bytes import token_text
from speculant.server.tools import ToolRequest, extract_calls


@dataclass
class Collected:
    """Everything a request produced, gathered from its deltas."""

    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    token_bytes: list[bytes] = field(default_factory=list)
    top_logprobs: list[list[tuple[bytes, float]]] = field(default_factory=list)
    last: RequestOutput | None = None  # the finished output: token ids, finish reason, stats

    def add(self, delta: Delta) -> None:
        self.text += delta.output.new_text
        self.logprobs += delta.logprobs or []
        self.token_bytes += delta.token_bytes or []
        self.top_logprobs += delta.top_logprobs or []
        self.last = delta.output


def usage_of(out: RequestOutput) -> Usage:
    n = len(out.token_ids)
    return Usage(
        prompt_tokens=out.num_prompt_tokens,
        completion_tokens=n,
        total_tokens=out.num_prompt_tokens + n,
    )


def speculation_of(stats: CompletionStats | None) -> Speculation | None:
    if stats is None:
        return None
    return Speculation(
        draft_tokens=stats.draft_tokens,
        accepted_tokens=stats.accepted_tokens,
        acceptance_rate=stats.acceptance_rate,
        tau=stats.tau,
    )


class _Formatter:
    def __init__(self, request_id: str, model: str, logprobs: bool, index: int = 0) -> None:
        self.index = index  # the choice this formatter formats (n > 1)
        self.request_id = request_id
        self.model = model
        self.logprobs = logprobs
        self.created = int(time.time())

    def for_choice(self, index: int):
        """A fresh formatter of the same response for choice `index` (n > 1)."""
        return type(self)(self.request_id, self.model, self.logprobs, index)

    def _head(self) -> dict:
        return {"id": self.request_id, "created": self.created, "model": self.model}

    @staticmethod
    def _tail(out: RequestOutput) -> tuple[str | None, Speculation | None]:
        """Finish reason and speculation, set only on the finishing chunk."""
        return (out.finish_reason, speculation_of(out.stats)) if out.finished else (None, None)


class CompletionFormatter(_Formatter):
    def __init__(self, request_id: str, model: str, logprobs: bool, index: int = 0) -> None:
        super().__init__(request_id, model, logprobs, index)
        self._chars = 0  # characters completed by the tokens so far
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def first_chunk(self) -> CompletionResponse | None:
        return None

    def chunk(self, delta: Delta) -> CompletionResponse:
        out = delta.output
        finish_reason, speculation = self._tail(out)
        logprobs = self._logprobs(delta.token_bytes or [], delta.logprobs or [], delta.top_logprobs)
        choice = CompletionChoice(index=self.index, text=out.new_text, logprobs=logprobs, finish_reason=finish_reason)
        return CompletionResponse(**self._head(), choices=[choice], speculation=speculation)

    def usage_chunk(self, out: RequestOutput) -> CompletionResponse:
        return CompletionResponse(**self._head(), choices=[], usage=usage_of(out))

    def response(self, result: Collected) -> CompletionResponse:
        out = result.last
        logprobs = self._logprobs(result.token_bytes, result.logprobs, result.top_logprobs or None)
        choice = CompletionChoice(
            index=self.index, text=result.text, logprobs=logprobs, finish_reason=out.finish_reason
        )
        return CompletionResponse(
            **self._head(),
            choices=[choice],
            usage=usage_of(out),
            speculation=speculation_of(out.stats),
        )

    def _logprobs(
        self, pieces: list[bytes], values: list[float], tops: list | None
    ) -> CompletionLogprobs | None:
        if not self.logprobs:
            return None
        offsets = []
        for piece in pieces:
            offsets.append(self._chars + self._flushed_by(piece))
            self._chars += len(self._utf8.decode(piece))
        return CompletionLogprobs(
            tokens=[token_text(p) for p in pieces],
            token_logprobs=values,
            text_offset=offsets,
            top_logprobs=[{token_text(p): v for p, v in row} for row in tops] if tops else None,
        )


    def _flushed_by(self, piece: bytes) -> int:
        """1 when `piece` ends a pending partial character that becomes U+FFFD before it, else 0
        (a token inside a character starts at that character)."""
        pending = self._utf8.getstate()[0]
        return int(bool(pending and piece and not 0x80 <= piece[0] <= 0xBF))


class ChatFormatter(_Formatter):
    """With tools in play (`server/tools.py`) the reply's text is held back and sent at the end,
    as tool calls or as content."""

    def __init__(self, request_id: str, model: str, logprobs: bool, index: int = 0, tools: ToolRequest | None = None) -> None:
        super().__init__(request_id, model, logprobs, index)
        self.tools = tools if tools is not None and tools.choice != "none" else None
        self._held = ""

    def for_choice(self, index: int) -> ChatFormatter:
        return ChatFormatter(self.request_id, self.model, self.logprobs, index, self.tools)

    def _reply(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """(the message fields, the finish reason) of a finished reply."""
        content, calls = extract_calls(self.tools, text) if self.tools is not None else (text, [])
        if not calls:
            return {"content": content}, finish_reason
        return {"content": content, "tool_calls": calls}, "tool_calls"

    def _delta(self, out: RequestOutput) -> tuple[dict, str | None]:
        finish_reason = out.finish_reason if out.finished else None
        if self.tools is None:
            return ({"content": out.new_text} if out.new_text else {}), finish_reason
        self._held += out.new_text
        if not out.finished:
            return {}, None
        fields, finish_reason = self._reply(self._held, finish_reason)
        for i, call in enumerate(fields.get("tool_calls", [])):
            call["index"] = i
        return {k: v for k, v in fields.items() if v}, finish_reason

    def first_chunk(self) -> ChatCompletionChunk:
        """The role comes first, before any token, as OpenAI streams it."""
        return ChatCompletionChunk(
            **self._head(), choices=[ChatChunkChoice(index=self.index, delta={"role": "assistant", "content": ""})]
        )

    def chunk(self, delta: Delta) -> ChatCompletionChunk:
        out = delta.output
        _, speculation = self._tail(out)
        fields, finish_reason = self._delta(out)
        choice = ChatChunkChoice(
            index=self.index,
            delta=fields,
            logprobs=self._logprobs(
                delta.token_bytes or [], delta.logprobs or [], delta.top_logprobs
            ),
            finish_reason=finish_reason,
        )
        return ChatCompletionChunk(**self._head(), choices=[choice], speculation=speculation)

    def usage_chunk(self, out: RequestOutput) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self._head(), choices=[], usage=usage_of(out))

    def response(self, result: Collected) -> ChatCompletionResponse:
        out = result.last
        fields, finish_reason = self._reply(result.text, out.finish_reason)
        choice = ChatChoice(
            index=self.index,
            message=AssistantMessage(**fields),
            logprobs=self._logprobs(
                result.token_bytes, result.logprobs, result.top_logprobs or None
            ),
            finish_reason=finish_reason,
        )
        return ChatCompletionResponse(
            **self._head(),
            choices=[choice],
            usage=usage_of(out),
            speculation=speculation_of(out.stats),
        )

    def _logprobs(
        self, pieces: list[bytes], values: list[float], tops: list | None
    ) -> ChatLogprobs | None:
        if not self.logprobs:
            return None
        rows = tops or [[] for _ in pieces]
        content = [
            TokenLogprob(
                token=token_text(p),
                logprob=v,
                bytes=list(p),
                top_logprobs=[TopLogprob(token=token_text(b), logprob=x, bytes=list(b)) for b, x in row],
            )
            for p, v, row in zip(pieces, values, rows, strict=True)
        ]
        return ChatLogprobs(content=content)
