"""Structured outputs through the server: the official openai client's
`beta.chat.completions.parse` with a pydantic model, streamed and not, on a plain and on a
speculative server (a tiny random model writes valid JSON only because the grammar makes it);
vLLM's `guided_*` fields; a bad schema or grammar is a 400 naming the field while other requests
run on."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, ConfigDict
from server_helpers import MODEL

CHAT = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]


class Verdict(BaseModel):
    # llguidance's JSON options ride in the schema: a random model left free whitespace pads forever
    model_config = ConfigDict(json_schema_extra={"x-guidance": {"whitespace_flexible": False}})

    answer: Literal["yes", "no"]
    sure: bool


def _client(running) -> OpenAI:
    return OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("which", ["server", "ngram_server", "draft_server"])
def test_parse_fills_a_pydantic_model(request, which):
    running = request.getfixturevalue(which)
    completion = _client(running).beta.chat.completions.parse(model=MODEL, messages=CHAT, response_format=Verdict, temperature=0, max_tokens=40)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Verdict), message.content
    assert completion.choices[0].finish_reason == "stop"


def test_parse_streamed_equals_parse(server):
    api = _client(server)
    whole = api.beta.chat.completions.parse(model=MODEL, messages=CHAT, response_format=Verdict, temperature=0, max_tokens=40)
    with api.beta.chat.completions.stream(model=MODEL, messages=CHAT, response_format=Verdict, temperature=0, max_tokens=40) as stream:
        chunks = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(chunks) > 1
    assert isinstance(final.choices[0].message.parsed, Verdict)
    assert final.choices[0].message.parsed == whole.choices[0].message.parsed
    assert "".join(chunks) == whole.choices[0].message.content


def test_speculative_constrained_output_equals_plain(server, ngram_server, draft_server):
    body = {"model": MODEL, "messages": CHAT, "temperature": 0, "max_tokens": 48, "response_format": {"type": "json_object"}}
    expected = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"]
    for running in (ngram_server, draft_server):
        got = httpx.post(f"{running.url}/v1/chat/completions", json=body, timeout=60).json()
        assert got["choices"][0]["message"]["content"] == expected


@pytest.mark.parametrize(
    "field, value, check",
    [
        ("guided_regex", "[0-9]{3}-[a-z]{2}", lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
        ("guided_choice", ["red", "green", "blue"], lambda t: t in ("red", "green", "blue")),
        ("guided_json", {"type": "object", "properties": {"n": {"type": "boolean"}}, "required": ["n"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}, lambda t: isinstance(json.loads(t)["n"], bool)),
        ("guided_grammar", 'start: "<" /[a-z]{1,3}/ ">"', lambda t: re.fullmatch("<[a-z]{1,3}>", t)),
        ("structured_outputs", {"regex": "x{2,4}"}, lambda t: re.fullmatch("x{2,4}", t)),
    ],
)
def test_vllm_guided_fields_on_completions(ngram_server, field, value, check):
    body = {"model": MODEL, "prompt": "Say it:", "temperature": 0, "max_tokens": 60, field: value}
    out = httpx.post(f"{ngram_server.url}/v1/completions", json=body, timeout=60).json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop", out
    assert check(choice["text"]), choice["text"]


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}, "response_format", "nonsense"),
        ({"guided_regex": "a(b"}, "guided_regex", "regex"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "undefined_rule"),
        ({"guided_json": "{not json"}, "guided_json", "JSON"),
        ({"guided_choice": []}, "guided_choice", "choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "response_format", "ignore_eos"),
    ],
)
def test_a_bad_constraint_is_a_400_naming_the_field(server, extra, field, words):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, **extra}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and words in error["message"], error


def test_other_requests_run_on_while_bad_constraints_are_refused(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            good = {"model": MODEL, "messages": CHAT, "max_tokens": 24, "temperature": 0, "response_format": {"type": "json_object"}}
            bad = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "guided_regex": "(unclosed"}
            return await asyncio.gather(*[client.post("/v1/chat/completions", json=good if i % 2 else bad) for i in range(8)])

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [400, 200] * 4
    assert len({r.json()["choices"][0]["message"]["content"] for r in responses[1::2]}) == 1
