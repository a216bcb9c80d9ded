"""Tool calling through the openai client: Llama 3's JSON format (SmolLM2's template names no
`<tool_call>`) and Qwen2.5's `<tool_call>` blocks (its tokenizer, a tiny random model); calls with
`required` and a named function, arguments that match the tool's schema (a random model writes
them only because the grammar makes it), `tool_calls` in responses and streams, a round trip
with the call and its result sent back, and under `auto` on Qwen2.5 the arguments constrained
once the model opens a call; speculative servers give the plain server's calls."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI
from server_helpers import CONTEXT, MODEL, engine_config, serve
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.config import SpeculativeConfig

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "celsius": {"type": "boolean"}},
                          "required": ["city", "celsius"], "additionalProperties": False}}}  # fmt: skip
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
         "required": ["zone"], "additionalProperties": False}}}  # fmt: skip
TOOLS = [WEATHER, CLOCK]
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(running) -> OpenAI:
    return OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)


def _check_call(call) -> dict:
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "Oslo") and isinstance(args["celsius"], bool), args
    else:
        assert call.function.name == "get_time" and args["zone"] in ("UTC", "CET"), args
    assert call.id.startswith("call_") and call.type == "function"
    return args


@pytest.fixture(scope="module")
def qwen_server():
    from speculant.loader import load_checkpoint

    tokenizer = load_checkpoint("qwen2.5-coder-0.5b").tokenizer
    model = tiny_hf_model("llama", vocab_size=len(tokenizer), max_position_embeddings=CONTEXT, bos_token_id=151643, eos_token_id=151645)
    with serve(TinyCheckpoint(model, tokenizer), engine_config()) as running:
        yield running


@pytest.mark.parametrize("which", ["server", "qwen_server"])
def test_required_and_named_tool_calls(request, which):
    api = _client(request.getfixturevalue(which))
    out = api.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    for call in choice.message.tool_calls:
        _check_call(call)
    named = api.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, max_tokens=200, temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_time"}})  # fmt: skip
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_time"]


@pytest.mark.parametrize("which", ["server", "qwen_server"])
def test_streamed_tool_calls_equal_the_whole_response(request, which):
    api = _client(request.getfixturevalue(which))
    body = dict(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
    whole = api.chat.completions.create(**body).choices[0].message.tool_calls
    calls, finish = {}, None
    for chunk in api.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                calls.setdefault(d.index, d)
    assert finish == "tool_calls"
    assert [(calls[i].function.name, calls[i].function.arguments) for i in sorted(calls)] == [(c.function.name, c.function.arguments) for c in whole]


def test_a_tool_round_trip(server):
    api = _client(server)
    first = api.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = [*CHAT, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]  # fmt: skip
    second = api.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_auto_constrains_the_arguments_once_a_call_opens(qwen_server):
    api = _client(qwen_server)
    opened = api.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, max_tokens=120, temperature=0,
                                         logit_bias={"151657": 100})  # fmt: skip  # <tool_call>: the model opens a call at once
    calls = opened.choices[0].message.tool_calls
    assert calls, opened.choices[0]
    _check_call(calls[0])
    free = api.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, max_tokens=12, temperature=0)
    assert free.choices[0].message.content and free.choices[0].finish_reason == "length"


def test_speculative_tool_calls_equal_plain(server, tiny_checkpoint):
    body = dict(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
    expected = [(c.function.name, c.function.arguments) for c in _client(server).chat.completions.create(**body).choices[0].message.tool_calls]
    spec = SpeculativeConfig(method="ngram", num_draft_tokens=3, adaptive_k=False)
    with serve(tiny_checkpoint, engine_config(spec)) as running:
        got = _client(running).chat.completions.create(**body).choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in got] == expected


def test_bad_tools_are_400s_naming_the_field(server):
    api = _client(server)
    for extra, field in [({"tools": [{"type": "function"}]}, "tools"), ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                         ({"tool_choice": "required"}, "tool_choice"), ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice")]:  # fmt: skip
        with pytest.raises(Exception) as info:
            api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, **extra)
        assert info.value.status_code == 400 and info.value.body["param"] == field, (extra, info.value.body)
