"""n > 1: several choices in one response, streamed and not, through the openai client; choice
0 of a seeded request is the n = 1 output, the others differ by their seed; usage counts the
prompt once and every choice's tokens; speculative servers give the plain server's choices."""

from __future__ import annotations

from openai import OpenAI
from server_helpers import MODEL

CHAT = [{"role": "user", "content": "Tell me a story."}]


def _client(running) -> OpenAI:
    return OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)


def test_completions_choices_and_usage(server):
    api = _client(server)
    one = api.completions.create(model=MODEL, prompt="Once", max_tokens=12, temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    many = api.completions.create(model=MODEL, prompt="Once", max_tokens=12, temperature=1.0, seed=5, n=3, extra_body={"ignore_eos": True})
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert many.choices[0].text == one.choices[0].text
    assert len({c.text for c in many.choices}) == 3
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    assert many.usage.completion_tokens == 36 and many.usage.total_tokens == 36 + one.usage.prompt_tokens


def test_streamed_chat_choices_equal_the_whole_response(server):
    api = _client(server)
    body = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=0.9, seed=3, n=2)
    whole = api.chat.completions.create(**body)
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for chunk in api.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
    assert [texts[i] for i in (0, 1)] == [c.message.content for c in whole.choices]
    assert [finishes[i] for i in (0, 1)] == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_speculative_choices_equal_plain(server, ngram_server, draft_server):
    body = dict(model=MODEL, messages=CHAT, max_tokens=16, temperature=0.8, seed=11, n=3)
    expected = [c.message.content for c in _client(server).chat.completions.create(**body).choices]
    for running in (ngram_server, draft_server):
        assert [c.message.content for c in _client(running).chat.completions.create(**body).choices] == expected
