"""Commit emitted tokens to requests: stop conditions (stop strings checked token by token, so a
stop inside accepted drafts cuts the tokens where plain decoding stops), incremental
detokenization, stats."""

from __future__ import annotations

import time
from dataclasses import dataclass

from speculant.core import CompletionStats, Request, RequestOutput, RequestStatus
from speculant.engine.detokenizer import IncrementalDetokenizer


@dataclass
class _TextState:
    detokenizer: IncrementalDetokenizer
    text: str = ""  # decoded output, cut at a stop string once one is found
    sent: int = 0  # characters already reported


class OutputProcessor:
    def __init__(self, tokenizer, max_position: int) -> None:
        self.tokenizer = tokenizer
        self.max_position = max_position
        self._text: dict[str, _TextState] = {}

    def append(
        self, req: Request, tokens: list[int], logprobs: list[float] | None, tops: list | None = None
    ) -> list[int]:
        """Append tokens until a stop condition; return those kept and set the status.

        With stop strings the text is checked after every token, as plain decoding checks it, so a
        stop string completed inside accepted drafts keeps the tokens up to the one completing it:
        token counts, logprobs and stats are those of plain decoding."""
        state = self._state(req)
        check_text = bool(req.params.stop) and self.tokenizer is not None
        appended = []
        for i, token in enumerate(tokens):
            req.output_token_ids.append(token)
            if logprobs is not None:
                req.output_logprobs.append(logprobs[i])
            if tops is not None and req.params.top_logprobs:
                req.output_top_logprobs.append(tops[i][: req.params.top_logprobs])
            appended.append(token)
            status = self._stop_status(req, token)
            if status is not None:
                req.status = status
            if check_text:
                self._update_text(req, state)  # a stop string finishes the request
            if req.finished:
                break
        if appended and req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        if appended and not check_text and self.tokenizer is not None:  # token-id-only models produce no text
            self._update_text(req, state)
        return appended

    def _stop_status(self, req: Request, token: int) -> RequestStatus | None:
        if token in req.stop_token_ids and not (req.params.ignore_eos and token not in req.params.stop_token_ids):
            return RequestStatus.FINISHED_STOPPED
        if len(req.output_token_ids) >= req.params.max_tokens or req.num_tokens >= self.max_position:
            return RequestStatus.FINISHED_LENGTH
        return None

    def make_output(self, req: Request, new_tokens: list[int]) -> RequestOutput:
        state = self._state(req)
        ready = len(state.text) if req.finished else _stable_length(state.text, req.params.stop)
        delta = state.text[state.sent : ready]
        state.sent = max(state.sent, ready)
        if req.finished:
            req.finish_time = req.finish_time or time.perf_counter()
            self._text.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id,
            text=state.text[: state.sent],
            token_ids=list(req.output_token_ids),
            new_token_ids=new_tokens,
            new_text=delta,
            finished=req.finished,
            finish_reason=req.status.value if req.finished else None,
            logprobs=list(req.output_logprobs) if req.params.logprobs else None,
            top_logprobs=list(req.output_top_logprobs) if req.params.top_logprobs else None,
            num_prompt_tokens=req.num_prompt_tokens,
            stats=completion_stats(req) if req.finished else None,
            error=req.error,
        )

    def _state(self, req: Request) -> _TextState:
        state = self._text.get(req.request_id)
        if state is None:
            state = self._text[req.request_id] = _TextState(IncrementalDetokenizer(self.tokenizer))
        return state

    def _update_text(self, req: Request, state: _TextState) -> None:
        """Decode the output so far; a stop string in it cuts the text and finishes the request."""
        text = state.detokenizer.update(req.output_token_ids)
        cut = _first_stop(text, req.params.stop, start=max(0, len(state.text) - _longest(req.params.stop)))
        if cut is not None:
            text = text[:cut]
            req.status = RequestStatus.FINISHED_STOPPED
        state.text = text


def _longest(stops: tuple[str, ...]) -> int:
    return max((len(s) for s in stops), default=0)


def _first_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _stable_length(text: str, stops: tuple[str, ...]) -> int:
    """How much of `text` can be streamed: not a trailing partial character, nor a suffix that
    could still become a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    for stop in stops:
        for n in range(min(len(stop) - 1, end), 0, -1):
            if text.endswith(stop[:n], 0, end):
                end -= n
                break
    return max(end, 0)


def completion_stats(req: Request) -> CompletionStats:
    end = req.finish_time or time.perf_counter()
    first = req.first_token_time or end
    n = len(req.output_token_ids)
    return CompletionStats(
        ttft_s=first - req.arrival_time,
        inter_token_latency_s=(end - first) / (n - 1) if n > 1 else 0.0,
        tokens_per_s=n / (end - req.arrival_time) if end > req.arrival_time else 0.0,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=n,
        num_preemptions=req.num_preemptions,
        tau=req.spec_stats.tau,
        acceptance_rate=req.spec_stats.acceptance_rate,
        draft_tokens=req.spec_stats.draft_tokens,
        accepted_tokens=req.spec_stats.accepted_tokens,
    )


def split_like(flat: list | None, emitted: list[list[int]]) -> list[list] | None:
    """Per-sequence slices of a flat list laid out like `emitted` (logprobs of emitted tokens)."""
    if flat is None:
        return None
    out, i = [], 0
    for e in emitted:
        out.append(flat[i : i + len(e)])
        i += len(e)
    return out
