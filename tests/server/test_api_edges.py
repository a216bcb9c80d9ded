"""The API at its edges: extreme sampling values, broken Unicode, partial-UTF-8 tokens in
logprobs, fields that are not honoured, output limits."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from server_helpers import CONTEXT, MODEL, engine_config, serve
from testkit import TinyCheckpoint

from speculant.config import SpeculativeConfig

C, X = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sharp(tiny_model, smol_tokenizer):
    """The tiny model with logits in the tens, as a trained model has: dividing them by a tiny
    temperature overflows float32."""
    checkpoint = TinyCheckpoint(tiny_model, smol_tokenizer)
    checkpoint.weights["lm_head.weight"] = checkpoint.weights["lm_head.weight"] * 50
    with serve(checkpoint, engine_config()) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        yield client


def _text(http: httpx.Client, **fields) -> str:
    body = {"model": MODEL, "prompt": "The weather today", "max_tokens": 12, "ignore_eos": True, **fields}
    response = http.post(C, json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    "fields",
    [{"temperature": 1e-38}, {"temperature": 1e-37}, {"temperature": 5e-324}, {"top_p": 1e-300}, {"top_p": 1e-45, "temperature": 1.0}],
    ids=["t=1e-38", "t=1e-37", "t=min-subnormal", "top_p=1e-300", "top_p=1e-45"],
)
def test_extreme_sampling_values_give_the_greedy_text(sharp, fields):
    greedy = _text(sharp, temperature=0)
    assert greedy.strip()
    assert _text(sharp, seed=3, **fields) == greedy


@pytest.mark.parametrize(
    "path, body, param",
    [
        (C, {"prompt": "hi \ud800 x"}, "prompt"),
        (C, {"prompt": ["hi \udfff"]}, "prompt"),
        (X, {"messages": [{"role": "user", "content": "hi \ud800 x"}]}, "messages"),
        (X, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}, "messages"),
        (X, {"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}, "messages"),
    ],
    ids=["completions", "completions-list", "chat", "chat-parts", "chat-name"],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(http, path, body, param):
    content = json.dumps({"model": MODEL, "max_tokens": 2, **body})  # "\\ud800": valid JSON
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"]


def test_an_error_quoting_a_lone_surrogate_is_still_json(http):
    content = json.dumps({"model": "m\ud800", "prompt": "hi"})
    response = http.post(C, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def _whole(token: str) -> bool:
    """A token shown as whole characters (not a part of one: U+FFFD, or OpenAI-style `\\xNN`)."""
    return "\ufffd" not in token and "\\x" not in token


def _with_partial_tokens(http: httpx.Client, path: str, body: dict, tokens_of) -> dict:
    """A sampled reply holding a token that is part of a UTF-8 character (seeds tried in order)."""
    for seed in range(40):
        reply = http.post(path, json={**body, "seed": seed, "temperature": 1.0, "ignore_eos": True}).json()
        if not all(_whole(t) for t in tokens_of(reply)):
            return reply
    raise AssertionError("no seed sampled a partial-UTF-8 token")


def test_chat_logprobs_carry_each_tokens_real_bytes(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "日本語: こんにちは"}], "max_tokens": 200, "logprobs": True}
    reply = _with_partial_tokens(http, X, body, lambda r: [t["token"] for t in r["choices"][0]["logprobs"]["content"]])
    content = reply["choices"][0]["logprobs"]["content"]
    partial = [t for t in content if not _whole(t["token"])]
    assert all(t["bytes"] != [0xEF, 0xBF, 0xBD] for t in partial), partial[:3]
    for t in partial:
        with pytest.raises(UnicodeDecodeError):
            bytes(t["bytes"]).decode("utf-8")
    joined = b"".join(bytes(t["bytes"]) for t in content)
    assert joined.decode("utf-8", "replace") == reply["choices"][0]["message"]["content"]


# "Hiä thereé", with each two-byte character split into its byte tokens (byte-level BPE spells
# bytes 0xC3, 0xA4, 0xA9 as the characters Ã, ¤, ©).
SCRIPT = ["Hi", "Ã", "¤", "Ġthere", "Ã", "©"]


@pytest.fixture
def scripted(tiny_checkpoint, smol_tokenizer, monkeypatch):
    """A server whose sampler emits SCRIPT, token by token."""
    import speculant.engine.sample_step as sample_step_module

    ids = iter(smol_tokenizer.convert_tokens_to_ids(SCRIPT))

    def scripted_sample(logits, *args, **kwargs):
        return torch.tensor([next(ids) for _ in range(logits.shape[0])])

    monkeypatch.setattr(sample_step_module, "sample_logits", scripted_sample)
    plain = engine_config(SpeculativeConfig(method="none"))  # the script replaces plain decoding's sampler
    with serve(tiny_checkpoint, plain) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        yield client


def test_text_offsets_count_characters_when_tokens_split_one(scripted):
    body = {"model": MODEL, "prompt": "x", "max_tokens": len(SCRIPT), "logprobs": 0, "ignore_eos": True}
    choice = scripted.post(C, json=body).json()["choices"][0]
    assert choice["text"] == "Hiä thereé"
    assert choice["logprobs"]["text_offset"] == [0, 2, 2, 3, 9, 9]  # characters, not tokens
    assert choice["logprobs"]["tokens"] == ["Hi", "\\xc3", "\\xa4", " there", "\\xc3", "\\xa9"]


def test_chat_logprob_bytes_of_a_split_character(scripted):
    body = {"model": MODEL, "messages": USER, "max_tokens": len(SCRIPT), "logprobs": True, "ignore_eos": True}
    content = scripted.post(X, json=body).json()["choices"][0]["logprobs"]["content"]
    assert [t["bytes"] for t in content] == [[72, 105], [0xC3], [0xA4], [32, 116, 104, 101, 114, 101], [0xC3], [0xA9]]


@pytest.mark.parametrize(
    "path, extra, param",
    [
        (X, {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        (X, {"function_call": "auto"}, "function_call"),
        (X, {"modalities": ["text", "audio"]}, "modalities"),
        (C, {"response_format": {"type": "json_object"}}, "response_format"),
    ],
    ids=["functions", "function_call", "modalities", "completions-response_format"],
)
def test_a_field_that_is_not_honoured_is_a_400_naming_it(http, path, extra, param):
    base = {"model": MODEL, "max_tokens": 2}
    base.update({"messages": USER} if path == X else {"prompt": "hi"})
    response = http.post(path, json={**base, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_response_format_text_is_accepted(http):
    body = {"model": MODEL, "messages": USER, "max_tokens": 2, "response_format": {"type": "text"}}
    assert http.post(X, json=body).status_code == 200


def test_top_logprobs_return_that_many_alternatives(http):
    chat = http.post(X, json={"model": MODEL, "messages": USER, "max_tokens": 6, "temperature": 0,
                              "logprobs": True, "top_logprobs": 5}).json()
    for entry in chat["choices"][0]["logprobs"]["content"]:
        tops = entry["top_logprobs"]
        assert len(tops) == 5
        values = [t["logprob"] for t in tops]
        assert values == sorted(values, reverse=True) and all(set(t) == {"token", "logprob", "bytes"} for t in tops)
        assert tops[0]["bytes"] == entry["bytes"] and tops[0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-5)

    done = http.post(C, json={"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 0, "logprobs": 3}).json()
    lp = done["choices"][0]["logprobs"]
    assert len(lp["top_logprobs"]) == len(lp["tokens"]) and all(1 <= len(t) <= 3 for t in lp["top_logprobs"])
    assert all(max(t.values()) == pytest.approx(v, abs=1e-5) for t, v in zip(lp["top_logprobs"], lp["token_logprobs"]))


@pytest.mark.parametrize(
    "path, field",
    [(C, "max_tokens"), (X, "max_tokens"), (X, "max_completion_tokens")],
)
def test_max_tokens_beyond_the_context_is_a_400(http, path, field):
    base = {"messages": USER} if path == X else {"prompt": "hi"}
    for value in (10**12, CONTEXT):
        response = http.post(path, json={"model": MODEL, **base, field: value})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and "maximum context length" in error["message"]


@pytest.mark.parametrize("path", [C, X])
def test_null_means_the_same_as_absent(http, path):
    base = {"model": MODEL, "temperature": 0, "ignore_eos": True}
    base.update({"messages": USER, "max_tokens": 5} if path == X else {"prompt": "hi"})
    absent = http.post(path, json=base).json()
    nulls = {"top_p": None, "stop": None, "seed": None, "stream": None, "logprobs": None, "n": None}
    if path == C:
        nulls["max_tokens"] = None
    else:
        nulls["max_completion_tokens"] = None
    present = http.post(path, json={**base, **nulls})
    assert present.status_code == 200, present.text
    assert present.json()["usage"] == absent["usage"]
    if path == C:
        assert absent["usage"]["completion_tokens"] == 16  # the OpenAI default
