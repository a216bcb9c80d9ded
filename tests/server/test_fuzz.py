"""Property: whatever a client sends to either endpoint, it gets a 200 or a 4xx in the OpenAI
error shape, and four victim streams running meanwhile finish with the text they get alone."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import MODEL, stream_sse
from victims import VICTIMS, alone, text_of

# ---- what a hostile client sends ----------------------------------------------------------

TRICKY_CHARACTERS = st.sampled_from(["\ud800", "\udfff", "\x00", "\ufffd", "é", "日", "🙂"])
ANY_TEXT = st.text(st.characters(exclude_categories=()) | TRICKY_CHARACTERS, max_size=24)  # surrogates too
EDGE_NUMBERS = st.sampled_from(
    [0, 1, -1, 2, 5, 20, 21, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30,
     0.0, -0.0, 0.5, 1e-38, 5e-324, 1e-300, 1.0000001, 2.0000001, 1e308, math.inf, -math.inf, math.nan]
)
NUMBERS = EDGE_NUMBERS | st.integers() | st.floats()
SCALARS = st.none() | st.booleans() | NUMBERS | ANY_TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=6,
)
INT64 = 2**63 - 1
TOKEN_IDS = st.lists(st.integers(0, 49_151) | st.sampled_from([49_152, INT64 + 1]), min_size=1, max_size=6)
SMALL_MAX_TOKENS = st.integers(min_value=1, max_value=6)

# In range or just past an edge: what a careful but unusual client sends. Anything else is JSON.
SAMPLING = {
    "model": st.just(MODEL),
    "temperature": st.floats(0, 2) | st.sampled_from([0, 1e-38, 5e-324, 1e-5, 2, 2.0000001]),
    "top_p": st.floats(0, 1, exclude_min=True) | st.sampled_from([5e-324, 1e-300, 1e-45, 1, 0]),
    "top_k": st.integers(-1, INT64) | st.sampled_from([-1, 0, 1, INT64, INT64 + 1, 2**64]),
    "min_p": st.floats(0, 1) | st.sampled_from([0, 1]),
    "seed": st.integers(0, INT64) | st.sampled_from([0, INT64, INT64 + 1]),
    "stop": ANY_TEXT | st.lists(ANY_TEXT, max_size=3) | st.none(),
    "n": st.sampled_from([1, None]),
    "stream": st.booleans() | st.none(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | st.none(),
    "ignore_eos": st.booleans(),
    "num_draft_tokens": st.integers(0, INT64) | st.sampled_from([0, 1, INT64, INT64 + 1]),
    "presence_penalty": st.sampled_from([0, 0.0, None]),
    "frequency_penalty": st.sampled_from([0, None]),
    "logit_bias": st.sampled_from([{}, None]),
    "user": ANY_TEXT,
}
COMPLETION = {
    **SAMPLING,
    "prompt": ANY_TEXT | TOKEN_IDS | st.lists(ANY_TEXT, min_size=1, max_size=1) | st.lists(TOKEN_IDS, min_size=1, max_size=1),
    "max_tokens": SMALL_MAX_TOKENS | st.sampled_from([None, 10**12, INT64 + 1]),
    "logprobs": st.integers(0, 5) | st.none(),
    "echo": st.sampled_from([False, None]),
    "suffix": st.sampled_from(["", None]),
    "best_of": st.sampled_from([1, None]),
}
PART = st.fixed_dictionaries({"type": st.just("text"), "text": ANY_TEXT})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
     "content": ANY_TEXT | st.lists(PART, max_size=2) | st.none()},
    optional={"name": ANY_TEXT},
)
CHAT = {
    **SAMPLING,
    "messages": st.lists(MESSAGE, min_size=1, max_size=3),
    "max_tokens": SMALL_MAX_TOKENS | st.sampled_from([10**12]),
    "max_completion_tokens": SMALL_MAX_TOKENS | st.sampled_from([10**12]),
    "logprobs": st.booleans() | st.none(),
    "top_logprobs": st.integers(0, 20) | st.none(),
    "tools": st.sampled_from([[], None]),
    "tool_choice": st.sampled_from(["none", None]),
    "response_format": st.just({"type": "text"}) | st.none(),
}
EXTRA_NAMES = st.sampled_from(["repetition_penalty", "functions", "modalities", "logprobs_mode", "x"]) | ANY_TEXT


def _bodies(fields: dict, required: str, limits: tuple[str, ...], short_default: bool):
    """Bodies with a few of the fields, each in range or (one time in six) any JSON value, now
    and then an unknown field or no required field. A reply stays short: a small output limit
    is added whenever none is present (and the endpoint's default is long)."""

    @st.composite
    def body(draw):
        names = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=5))
        if required not in names and draw(st.integers(0, 9)) > 0:
            names.append(required)
        out = {n: draw(JSON if draw(st.integers(0, 5)) == 0 else fields[n]) for n in names}
        if draw(st.integers(0, 9)) == 0:
            out[draw(EXTRA_NAMES)] = draw(JSON)
        given = [out[limit] for limit in limits if limit in out]
        short = any(isinstance(v, int) for v in given) or (short_default and not given)
        if not short:
            out[limits[0]] = draw(SMALL_MAX_TOKENS)
        return out

    return body()


REQUESTS = st.one_of(
    st.tuples(st.just("/v1/completions"), _bodies(COMPLETION, "prompt", ("max_tokens",), short_default=True)),
    st.tuples(st.just("/v1/chat/completions"), _bodies(CHAT, "messages", ("max_completion_tokens", "max_tokens"), short_default=False)),
    st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), JSON),
)

# ---- victims on their own thread, round after round ----------------------------------------


class Victims(threading.Thread):
    """Runs rounds of the four victim streams until stopped; records every round's results."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stopping = threading.Event()
        self.rounds: list[list] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._rounds())
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _rounds(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as client:
            while not self.stopping.is_set():
                self.rounds.append(
                    await asyncio.gather(*(stream_sse(client, "/v1/completions", v) for v in VICTIMS))
                )


def _check_reply(response: httpx.Response, streamed: bool) -> None:
    assert response.status_code == 200 or 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        return
    if streamed:
        lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert not any("error" in json.loads(line[6:]) for line in lines[:-1]), lines[-3:]
    else:
        assert response.json()["choices"]


@pytest.fixture(scope="module")
def victims(server):
    expected = alone(server.url)
    running = Victims(server.url)
    running.start()
    yield running
    running.stopping.set()
    running.join(120)
    assert not running.is_alive() and running.error is None, running.error
    assert running.rounds, "no victim round ran"
    for results in running.rounds:
        for result, text in zip(results, expected, strict=True):
            assert result.status == 200 and result.done, result.events[-1:]
            assert not any("error" in e for e in result.events)
            assert text_of(result) == text


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=REQUESTS)
def test_fuzzed_requests_get_200_or_a_4xx_and_hurt_no_one(server, victims, request):
    path, body = request
    content = json.dumps(body)  # NaN and Infinity included, as Python clients send them
    with httpx.Client(base_url=server.url, timeout=120) as client:
        response = client.post(path, content=content, headers={"content-type": "application/json"})
    _check_reply(response, streamed=isinstance(body, dict) and body.get("stream") is True)
    assert victims.is_alive(), victims.error
