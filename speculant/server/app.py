"""The OpenAI-compatible HTTP API over one `AsyncEngine`.

    POST /v1/completions, POST /v1/chat/completions   (stream=true: server-sent events)
    GET  /v1/models, GET /health, GET /metrics (Prometheus)
    POST /tokenize, POST /detokenize, GET /version     (`utility_routes`)

The app's lifespan starts the engine thread and, on shutdown, drains it. Around the routes, from
the outside in: CORS (only with allowed origins), the API key (only when set), the body limit.
Prompts are tokenized in the `PromptEncoder`'s threads; the engine thread only admits token ids.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.middleware.cors import CORSMiddleware

from speculant.sampling.params import SamplingParams
from speculant.server.async_engine import AsyncEngine
from speculant.server.auth import ApiKeyAuth
from speculant.server.choices import choice_events, combined_response, submit_choices
from speculant.server.errors import APIError, bad_request, from_engine_error, install_error_handlers
from speculant.server.limits import BodyLimit
from speculant.server.options import ServerOptions
from speculant.server.prompts import PromptEncoder
from speculant.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from speculant.server.request_params import SAMPLING_FIELDS, admission_error, sampling_params
from speculant.server.request_stream import Chat, RequestStream
from speculant.server.responses import ChatFormatter, CompletionFormatter
from speculant.server.streaming import Formatter, SSEResponse, collect, collect_all, sse_events
from speculant.server.tools import tool_format, tool_request
from speculant.server.utility_routes import add_utility_routes


def create_app(
    async_engine: AsyncEngine, model_name: str, options: ServerOptions | None = None
) -> FastAPI:
    options = options or ServerOptions()
    encoder = PromptEncoder(async_engine.engine.tokenizer, options.tokenizer_threads)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await async_engine.start()
        yield
        await async_engine.shutdown(options.drain_timeout_s)
        encoder.close()

    docs = options.enable_docs
    app = FastAPI(
        title="speculant",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.async_engine = async_engine
    app.state.options = options
    record_error = async_engine.metrics.record_error
    install_error_handlers(app, record_error)
    _add_middleware(app, options, record_error)
    api = _Handlers(async_engine, model_name, encoder, options.api_key)
    app.get("/v1/models")(api.models)
    app.get("/health")(api.health)
    app.get("/metrics")(api.metrics)
    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat_completions)
    add_utility_routes(app, encoder, async_engine.engine.arch.vocab_size, async_engine.engine.arch.max_position)
    return app


def _add_middleware(app: FastAPI, options: ServerOptions, record_error) -> None:
    """Added innermost first: the body limit, then the API key, then CORS outermost (so preflight
    requests carry no key and refusals still carry CORS headers)."""
    app.add_middleware(
        BodyLimit,
        max_bytes=options.max_body_bytes,
        timeout_s=options.body_timeout_s,
        record_error=record_error,
    )
    if options.api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=options.api_key, record_error=record_error)
    if options.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )


class _Handlers:
    def __init__(self, async_engine: AsyncEngine, model_name: str, encoder: PromptEncoder, api_key: str | None = None) -> None:
        self.async_engine = async_engine
        # requests without a `user` are scoped by the API key they passed (the only key there is)
        self.key_scope = "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else None
        self.encoder = encoder
        self.model_name = model_name
        self.created = int(time.time())
        self.max_position = async_engine.engine.arch.max_position
        self.generation_defaults = async_engine.engine.arch.generation.sampling_overrides()  # generation_config.json
        self.tool_format = tool_format(encoder.tokenizer) if encoder.tokenizer is not None else (False, False)

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
        ids = await self.encoder.encode(prompt, "prompt")
        max_tokens = self._max_tokens(len(ids), body.output_limit, "max_tokens", "prompt")
        params = sampling_params(
            body, max_tokens, logprobs=body.logprobs is not None, top_logprobs=body.logprobs or 0,
            defaults=self.generation_defaults,
        )
        formatter = CompletionFormatter(
            f"cmpl-{uuid.uuid4().hex}", self.model_name, body.logprobs is not None
        )
        return await self._serve(request, body, ids, params, formatter, prompt_field="prompt")

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self._check(body)
        try:
            tools = tool_request(body.tools, body.tool_choice, self.tool_format)
        except ValueError as exc:
            raise bad_request(str(exc), str(exc).split(" ", 1)[0].rstrip(":")) from None
        ids = await self.encoder.encode(Chat([m.template_dict() for m in body.messages], body.tools or None), "messages")
        # Without a limit a chat reply may run to the end of the context, as in the OpenAI API.
        field = body.max_tokens_field
        max_tokens = self._max_tokens(len(ids), body.output_limit, field, "messages")
        logprobs = bool(body.logprobs)
        top = body.top_logprobs or 0
        params = sampling_params(body, max_tokens, logprobs=logprobs, top_logprobs=top, tools=tools, defaults=self.generation_defaults)
        formatter = ChatFormatter(f"chatcmpl-{uuid.uuid4().hex}", self.model_name, logprobs, tools=tools)
        return await self._serve(request, body, ids, params, formatter, prompt_field="messages")

    def _max_tokens(self, n: int, requested: int | None, field: str, prompt_field: str) -> int:
        """The output limit: what was asked, or the rest of the context; more than fits is a 400."""
        limit = self.max_position
        if n >= limit:
            raise bad_request(
                f"{prompt_field} is {n} tokens, longer than the model's context of {limit} "
                "(leave room for one output token)",
                prompt_field,
            )
        if requested is None:
            return limit - n
        if n + requested > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + requested} tokens ({n} in the {prompt_field}, {requested} in the "
                f"completion). Please reduce the length of the {prompt_field} or {field}.",
                field,
            )
        return requested

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
        prompt_ids: list[int],
        params: SamplingParams,
        formatter: Formatter,
        prompt_field: str,
    ) -> Response:
        if (body.n or 1) > 1:
            return await self._serve_choices(request, body, prompt_ids, params, formatter, prompt_field)
        try:
            user = _scope(self.key_scope, body.user)
            stream = await self.async_engine.submit(formatter.request_id, prompt_ids, params, user)
        except ValueError as exc:
            raise admission_error(exc, body, prompt_field) from None
        except Exception as exc:
            raise from_engine_error(exc, SAMPLING_FIELDS, prompt_field) from None
        if body.stream:
            events = sse_events(stream, formatter, body.include_usage)
            return SSEResponse(events, on_close=lambda: self._abort_unfinished(stream))
        try:
            result = await collect(stream, request)
        except Exception as exc:
            raise from_engine_error(exc, SAMPLING_FIELDS, prompt_field) from None
        finally:
            self._abort_unfinished(stream)
        if result is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        if result.last.error is not None:  # the engine failed this request alone
            raise APIError(500, result.last.error, code="engine_error", type="server_error")
        return Response(formatter.response(result).model_dump_json(), media_type="application/json")

    async def _serve_choices(self, request, body, prompt_ids, params, formatter: Formatter, prompt_field: str) -> Response:
        """n > 1 (`server/choices.py`)."""
        formatters = [formatter.for_choice(i) for i in range(body.n)]
        try:
            streams = await submit_choices(self.async_engine, formatters, prompt_ids, params, _scope(self.key_scope, body.user))
        except ValueError as exc:
            raise admission_error(exc, body, prompt_field) from None
        except Exception as exc:
            raise from_engine_error(exc, SAMPLING_FIELDS, prompt_field) from None

        def abort_unfinished() -> None:
            for stream in streams:
                self._abort_unfinished(stream)

        if body.stream:
            return SSEResponse(choice_events(streams, formatters, body.include_usage), on_close=abort_unfinished)
        try:
            results = await collect_all(streams, request)
        except Exception as exc:
            raise from_engine_error(exc, SAMPLING_FIELDS, prompt_field) from None
        finally:
            abort_unfinished()
        if results is None:
            return Response(status_code=499)
        for result in results:
            if result.last.error is not None:
                raise APIError(500, result.last.error, code="engine_error", type="server_error")
        return Response(combined_response(formatters, results).model_dump_json(), media_type="application/json")

    def _abort_unfinished(self, stream: RequestStream) -> None:
        if not stream.finished:
            self.async_engine.abort(stream.request_id)


def _scope(key_scope: str | None, user: str | None) -> str | None:
    """The n-gram store scope: the API key's, narrowed by `user`, so naming a user never enters
    another key's scope."""
    if not user:
        return key_scope
    return f"{key_scope}/user:{user}" if key_scope else f"user:{user}"
