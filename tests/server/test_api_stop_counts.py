"""Counts through the API are exact under speculation: with a stop string inside accepted drafts,
the n-gram and draft-model servers answer what the plain server answers — text, usage, logprobs
and their text offsets, finish reason — streamed and not; and the n-gram store's scope under an
API key is the key's, narrowed by `user`."""

from __future__ import annotations

import pytest
from openai import OpenAI
from server_helpers import MODEL

from speculant.server.app import _scope

FRUIT = "Fruit list:\napple, banana, cherry, date, elderberry, fig, grape\n" * 3
PROMPTS = [FRUIT, "1, 2, 3, 4,", "Once upon a time, in a land far away,"]


def _client(running) -> OpenAI:
    return OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=60)


def _whole(api: OpenAI, **kwargs) -> tuple:
    out = api.completions.create(model=MODEL, temperature=0, logprobs=1, **kwargs)
    c = out.choices[0]
    lp = c.logprobs
    return c.text, c.finish_reason, out.usage.completion_tokens, lp.tokens, lp.token_logprobs, lp.text_offset, lp.top_logprobs


def _streamed(api: OpenAI, **kwargs) -> tuple:
    chunks = list(api.completions.create(model=MODEL, temperature=0, logprobs=1, stream=True, stream_options={"include_usage": True}, **kwargs))
    choices = [c.choices[0] for c in chunks if c.choices]
    lps = [c.logprobs for c in choices if c.logprobs is not None]
    return (
        "".join(c.text for c in choices),
        choices[-1].finish_reason,
        chunks[-1].usage.completion_tokens,
        [t for lp in lps for t in lp.tokens],
        [v for lp in lps for v in lp.token_logprobs],
        [o for lp in lps for o in lp.text_offset],
        [t for lp in lps for t in (lp.top_logprobs or [])],
    )


def _stops(api: OpenAI) -> list[tuple[str, str]]:
    """(prompt, stop) pairs: 2-5 characters from along each prompt's plain greedy text."""
    pairs = []
    for prompt in PROMPTS:
        text = api.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0).choices[0].text
        for start in range(1, max(2, len(text) - 5), max(1, len(text) // 5)):
            stop = text[start : start + 2 + start % 4]
            if stop.strip():
                pairs.append((prompt, stop))
    return pairs


@pytest.mark.parametrize("kind", ["ngram_server", "draft_server"])
def test_stops_inside_accepted_drafts_answer_as_plain_decoding(request, server, kind):
    plain, spec = _client(server), _client(request.getfixturevalue(kind))
    pairs = _stops(plain)
    assert pairs
    accepted = 0
    for prompt, stop in pairs:
        expected = _whole(plain, prompt=prompt, max_tokens=48, stop=stop)
        assert expected[1] == "stop" and len(expected[5]) == expected[2]
        assert _whole(spec, prompt=prompt, max_tokens=48, stop=stop) == expected, stop
        assert _streamed(spec, prompt=prompt, max_tokens=48, stop=stop) == expected, stop
        out = spec.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0, stop=stop)
        accepted += out.speculation["accepted_tokens"]
        assert out.speculation["accepted_tokens"] <= out.usage.completion_tokens - 1
    assert accepted > 0, "no drafts were accepted: the stops never fell inside accepted drafts"


@pytest.mark.parametrize("kind", ["ngram_server", "draft_server"])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_max_tokens_bounds_drafts_and_counts(request, server, kind, max_tokens):
    spec = _client(request.getfixturevalue(kind))
    expected = _whole(_client(server), prompt=FRUIT, max_tokens=max_tokens)
    assert _whole(spec, prompt=FRUIT, max_tokens=max_tokens) == expected
    assert _streamed(spec, prompt=FRUIT, max_tokens=max_tokens) == expected
    out = spec.completions.create(model=MODEL, prompt=FRUIT, max_tokens=max_tokens, temperature=0)
    assert out.speculation["draft_tokens"] <= max(0, max_tokens - 2) * 3  # k <= tokens left after the bonus
    assert out.speculation["accepted_tokens"] <= max_tokens - 1


def test_the_store_scope_under_an_api_key_is_the_key_and_the_user():
    assert _scope("key:a", "alice") != _scope("key:b", "alice")
    assert _scope("key:a", "alice") != _scope(None, "alice")
    assert _scope("key:a", None) == "key:a" and _scope(None, None) is None
    assert _scope("key:a", "alice") != _scope("key:a", "bob")
