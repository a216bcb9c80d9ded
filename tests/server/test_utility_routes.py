"""/tokenize, /detokenize and /version, and chat messages as clients send them back after a tool
round (tool_calls, tool_call_id, refusal, null fields)."""

from __future__ import annotations

import httpx
from openai import OpenAI
from server_helpers import MODEL, engine_config, serve

import speculant
from speculant.server import ServerOptions

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def _post(running, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{running.url}{path}", json=body, timeout=30, **kwargs)


def test_tokenize_a_prompt_and_a_chat_as_the_completions_count_them(server, smol_tokenizer):
    out = _post(server, "/tokenize", {"prompt": "Hello there, world"}).json()
    assert out["tokens"] == smol_tokenizer.encode("Hello there, world", add_special_tokens=True)
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] == server.async_engine.engine.arch.max_position
    chat = _post(server, "/tokenize", {"model": MODEL, "messages": CHAT}).json()
    api = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    usage = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, temperature=0).usage
    assert chat["count"] == usage.prompt_tokens


def test_detokenize_inverts_tokenize(server):
    ids = _post(server, "/tokenize", {"prompt": "Fruit: apple, fig"}).json()["tokens"]
    assert _post(server, "/detokenize", {"tokens": ids}).json() == {"prompt": "Fruit: apple, fig"}


def test_bad_tokenize_and_detokenize_bodies_are_400s_naming_the_field(server):
    vocab = server.async_engine.engine.arch.vocab_size
    for path, body, field in [
        ("/detokenize", {"tokens": [1, vocab]}, "tokens"),
        ("/detokenize", {"tokens": ["1"]}, "tokens"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": CHAT}, "prompt"),
        ("/tokenize", {"prompt": ""}, "prompt"),
        ("/tokenize", {"prompt": "a", "extra": 1}, "extra"),
    ]:
        response = _post(server, path, body)
        assert response.status_code == 400, (body, response.text)
        assert field in (response.json()["error"]["param"] or ""), (body, response.json())


def test_version(server):
    assert httpx.get(f"{server.url}/version").json() == {"version": speculant.__version__}


def test_tokenize_needs_the_api_key_when_one_is_set(tiny_checkpoint):
    with serve(tiny_checkpoint, engine_config(), options=ServerOptions(api_key="sesame")) as running:
        assert _post(running, "/tokenize", {"prompt": "hi"}).status_code == 401
        assert _post(running, "/detokenize", {"tokens": [1]}).status_code == 401
        ok = _post(running, "/tokenize", {"prompt": "hi"}, headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200 and ok.json()["count"] > 0
        assert httpx.get(f"{running.url}/version").status_code == 200


def test_messages_after_a_tool_round_are_accepted(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    messages = [
        {"role": "user", "content": "Weather in Oslo?", "name": None},
        {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None},
        {"role": "tool", "content": "4 degrees, rain", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "It is 4 degrees.", "refusal": None, "tool_calls": None},
        {"role": "user", "content": "Thanks"},
    ]
    api = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    out = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length")
    rendered = _post(server, "/tokenize", {"messages": messages}).json()
    assert rendered["count"] == out.usage.prompt_tokens


def test_stop_token_ids_stop_where_the_token_comes_and_out_of_vocabulary_is_a_400(server):
    api = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    full = api.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=8, temperature=0, logprobs=0)
    ids = _post(server, "/tokenize", {"prompt": full.choices[0].text}).json()["tokens"]
    stop = ids[2]
    cut = api.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=8, temperature=0, extra_body={"stop_token_ids": [stop]})
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens <= 3
    bad = _post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stop_token_ids": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop_token_ids", bad.text
