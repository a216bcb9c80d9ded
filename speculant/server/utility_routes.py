"""Routes beside the OpenAI API, named as vLLM names them:

    POST /tokenize    {"prompt": str} or {"messages": [...]} -> {"tokens", "count", "max_model_len"}
    POST /detokenize  {"tokens": [int]} -> {"prompt": str}
    GET  /version     {"version": str}

Tokenizing runs in the `PromptEncoder`'s threads, off the engine thread; a chat is rendered with
the model's chat template exactly as /v1/chat/completions renders it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from speculant.server.errors import bad_request
from speculant.server.prompts import PromptEncoder
from speculant.server.protocol import ChatMessage, TokenIds
from speculant.server.request_stream import Chat


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    tokens: TokenIds


def add_utility_routes(app: FastAPI, encoder: PromptEncoder, vocab_size: int, max_position: int) -> None:
    async def tokenize(body: TokenizeRequest) -> dict:
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("send exactly one of prompt and messages", "prompt")
        if body.messages is not None:
            ids = await encoder.encode(Chat([m.template_dict() for m in body.messages]), "messages")
        else:
            ids = await encoder.encode(body.prompt, "prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": max_position}

    async def detokenize(body: DetokenizeRequest) -> dict:
        bad = [t for t in body.tokens if t >= vocab_size]
        if bad:
            raise bad_request(f"tokens must be in [0, {vocab_size}), got {bad[:5]}", "tokens")
        return {"prompt": await encoder.decode(body.tokens, "tokens")}

    async def version_route() -> dict:
        return {"version": _installed_version()}

    app.post("/tokenize")(tokenize)
    app.post("/detokenize")(detokenize)
    app.get("/version")(version_route)


def _installed_version() -> str:
    """The installed package's version (`speculant/__init__.py` sits above the server)."""
    try:
        return version("speculant")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
