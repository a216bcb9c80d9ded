"""The OpenAI-compatible HTTP API over one `AsyncEngine`.

    POST /v1/completions, POST /v1/chat/completions   (stream=true: server-sent events)
    GET  /v1/models, GET /health, GET /metrics (Prometheus)

The app's lifespan starts the engine thread and, on shutdown, drains it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from speculant.sampling.params import SamplingParams
from speculant.server.async_engine import AsyncEngine
from speculant.server.errors import APIError, bad_request, from_engine_error, install_error_handlers
from speculant.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from speculant.server.request_stream import Chat, RequestStream
from speculant.server.responses import ChatFormatter, CompletionFormatter
from speculant.server.streaming import Formatter, SSEResponse, collect, sse_events

_SAMPLING_FIELDS = {
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "num_draft_tokens",
}


def create_app(
    async_engine: AsyncEngine, model_name: str, drain_timeout_s: float = 30.0
) -> FastAPI:
    """`drain_timeout_s`: how long shutdown lets in-flight requests finish before aborting them."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await async_engine.start()
        yield
        await async_engine.shutdown(drain_timeout_s)

    app = FastAPI(title="speculant", lifespan=lifespan)
    app.state.async_engine = async_engine
    app.state.drain_timeout_s = drain_timeout_s
    install_error_handlers(app, async_engine.metrics.record_error)
    api = _Handlers(async_engine, model_name)
    app.get("/v1/models")(api.models)
    app.get("/health")(api.health)
    app.get("/metrics")(api.metrics)
    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat_completions)
    return app


class _Handlers:
    def __init__(self, async_engine: AsyncEngine, model_name: str) -> None:
        self.async_engine = async_engine
        self.model_name = model_name
        self.created = int(time.time())
        self.max_position = async_engine.engine.arch.max_position

    async def models(self) -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=self.model_name, created=self.created, max_model_len=self.max_position)
            ]
        )

    async def health(self) -> JSONResponse:
        if not self.async_engine.accepting:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(self) -> Response:
        metrics = self.async_engine.metrics
        return Response(metrics.render(), media_type=metrics.content_type)

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self._check(body)
        try:
            prompt = body.single_prompt()
        except ValueError as exc:
            raise bad_request(str(exc), "prompt") from None
        params = _sampling_params(body, body.max_tokens, logprobs=body.logprobs is not None)
        formatter = CompletionFormatter(
            f"cmpl-{uuid.uuid4().hex}", self.model_name, body.logprobs is not None
        )
        return await self._serve(request, body, prompt, params, formatter, prompt_field="prompt")

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self._check(body)
        prompt = Chat([m.template_dict() for m in body.messages])
        # Without a limit a chat reply may run to the end of the context, as in the OpenAI API.
        params = _sampling_params(
            body, body.output_limit or self.max_position, logprobs=body.logprobs
        )
        formatter = ChatFormatter(f"chatcmpl-{uuid.uuid4().hex}", self.model_name, body.logprobs)
        return await self._serve(request, body, prompt, params, formatter, prompt_field="messages")

    def _check(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        if body.model is not None and body.model != self.model_name:
            raise APIError(
                404,
                f"The model '{body.model}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )
        unsupported = body.unsupported()
        if unsupported is not None:
            raise bad_request(unsupported[1], unsupported[0])

    async def _serve(
        self,
        request: Request,
        body: CompletionRequest | ChatCompletionRequest,
        prompt: str | list[int] | Chat,
        params: SamplingParams,
        formatter: Formatter,
        prompt_field: str,
    ) -> Response:
        try:
            stream = await self.async_engine.submit(formatter.request_id, prompt, params)
        except Exception as exc:
            raise from_engine_error(exc, _SAMPLING_FIELDS, prompt_field) from None
        if body.stream:
            events = sse_events(stream, formatter, body.include_usage)
            return SSEResponse(events, on_close=lambda: self._abort_unfinished(stream))
        try:
            result = await collect(stream, request)
        except Exception as exc:
            raise from_engine_error(exc, _SAMPLING_FIELDS, prompt_field) from None
        finally:
            self._abort_unfinished(stream)
        if result is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return Response(formatter.response(result).model_dump_json(), media_type="application/json")

    def _abort_unfinished(self, stream: RequestStream) -> None:
        if not stream.finished:
            self.async_engine.abort(stream.request_id)


def _sampling_params(
    body: CompletionRequest | ChatCompletionRequest, max_tokens: int | None, logprobs: bool
) -> SamplingParams:
    chosen = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": max(body.top_k, 0) if body.top_k is not None else None,
        "min_p": body.min_p,
        "seed": body.seed,
        "stop": (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
        "num_draft_tokens": body.num_draft_tokens,
        "max_tokens": max_tokens,
    }
    kwargs = {k: v for k, v in chosen.items() if v is not None}
    try:
        return SamplingParams(**kwargs, logprobs=logprobs, ignore_eos=body.ignore_eos)
    except ValueError as exc:
        raise bad_request(str(exc), str(exc).split(" ", 1)[0]) from None
