"""n > 1: one engine request per choice, answered as one response.

Choice i is its own engine request (`{response id}-{i}`; a seeded request's choice i has seed +
i, so choices differ), run side by side in the engine's batches; the prompt's KV is computed per
choice (no prefix sharing yet). A streamed response interleaves the choices' chunks, each with
its `index`; usage counts the prompt once and every choice's tokens; the `speculation` extension
is left out (it is per engine request). A client that goes away aborts every choice.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from speculant.core import RequestOutput
from speculant.sampling.params import SEED_MAX, SamplingParams
from speculant.server.protocol import Usage
from speculant.server.request_stream import EngineFailed, RequestStream
from speculant.server.responses import Collected
from speculant.server.streaming import Formatter, error_event, sse


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    if params.seed is None or index == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) % (SEED_MAX + 1))


async def submit_choices(async_engine, formatters: Sequence[Formatter], prompt_ids: list[int], params: SamplingParams, user: str | None) -> list[RequestStream]:
    """Admit every choice, or none: a refusal aborts the choices admitted before it."""
    streams: list[RequestStream] = []
    try:
        for f in formatters:
            streams.append(await async_engine.submit(f"{f.request_id}-{f.index}", prompt_ids, choice_params(params, f.index), user))
    except BaseException:
        for stream in streams:
            async_engine.abort(stream.request_id)
        raise
    return streams


def total_usage(outputs: Sequence[RequestOutput]) -> Usage:
    completion = sum(len(o.token_ids) for o in outputs)
    prompt = outputs[0].num_prompt_tokens
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def combined_response(formatters: Sequence[Formatter], results: Sequence[Collected]):
    """One response body holding every choice."""
    bodies = [f.response(r) for f, r in zip(formatters, results)]
    body = bodies[0]
    body.choices = [b.choices[0] for b in bodies]
    body.usage = total_usage([r.last for r in results])
    body.speculation = None
    return body


async def choice_events(streams: Sequence[RequestStream], formatters: Sequence[Formatter], include_usage: bool) -> AsyncIterator[str]:
    """Every choice's chunks as they come, then the summed usage and [DONE]."""
    for f in formatters:
        first = f.first_chunk()
        if first is not None:
            yield sse(first)
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for delta in streams[i]:
                queue.put_nowait((i, delta))
        except EngineFailed as exc:
            queue.put_nowait((i, exc))
        queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(streams))]
    finals: dict[int, RequestOutput] = {}
    try:
        for _ in range(len(streams)):
            while (item := await queue.get())[1] is not None:
                i, delta = item
                if isinstance(delta, BaseException):
                    yield error_event(str(delta))
                    continue
                chunk = formatters[i].chunk(delta)
                chunk.speculation = None
                yield sse(chunk)
                if delta.output.finished:
                    finals[i] = delta.output
                if delta.output.error is not None:
                    yield error_event(delta.output.error)
        if include_usage and len(finals) == len(streams):
            chunk = formatters[0].usage_chunk(finals[0])
            chunk.usage = total_usage([finals[i] for i in range(len(streams))])
            yield sse(chunk)
    finally:
        for task in tasks:
            task.cancel()
    yield "data: [DONE]\n\n"
