"""The OpenAI API through the official client: shapes, streaming, seeds, logprobs, losslessness."""

from __future__ import annotations

import pytest
from openai import OpenAI
from server_helpers import MODEL, engine_config

from speculant.llm import LLM
from speculant.sampling.params import SamplingParams

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "1, 2, 3, 4,"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def client(running) -> OpenAI:
    return OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=60)


def stream_completion(api: OpenAI, **kwargs) -> tuple[str, list, object]:
    """(text, chunks, usage) of a streamed completion."""
    chunks = list(
        api.completions.create(
            model=MODEL, stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    return text, chunks, chunks[-1].usage


def stream_chat(api: OpenAI, **kwargs) -> tuple[str, list, object]:
    chunks = list(
        api.chat.completions.create(
            model=MODEL, stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks, chunks[-1].usage


def test_models_lists_the_served_model(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_shape(server):
    out = client(server).completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0
    )
    choice = out.choices[0]
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert choice.finish_reason in ("stop", "length") and choice.text
    assert out.usage.completion_tokens <= 12 and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert set(out.speculation) == {"draft_tokens", "accepted_tokens", "acceptance_rate", "tau"}


def test_chat_shape(server):
    out = client(server).chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=10, temperature=0
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.usage.completion_tokens <= 10


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_completion_equals_non_streamed_with_a_seed(server, prompt):
    api = client(server)
    kwargs = dict(prompt=prompt, max_tokens=24, temperature=0.9, top_p=0.95, seed=1234, logprobs=0)
    whole = api.completions.create(model=MODEL, **kwargs)
    text, chunks, usage = stream_completion(api, **kwargs)
    assert text == whole.choices[0].text
    assert usage.completion_tokens == whole.usage.completion_tokens
    streamed_logprobs = [
        lp for c in chunks if c.choices for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed_logprobs == pytest.approx(whole.choices[0].logprobs.token_logprobs)
    assert len(streamed_logprobs) == usage.completion_tokens
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finishing] == [whole.choices[0].finish_reason]
    assert finishing[0].speculation == whole.speculation


def test_streamed_chat_equals_non_streamed_with_a_seed(server):
    api = client(server)
    kwargs = dict(messages=CHAT, max_tokens=24, temperature=1.0, seed=7, logprobs=True)
    whole = api.chat.completions.create(model=MODEL, **kwargs)
    text, chunks, usage = stream_chat(api, **kwargs)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    tokens = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert len(tokens) == usage.completion_tokens == whole.usage.completion_tokens
    assert [t.token for t in tokens] == [t.token for t in whole.choices[0].logprobs.content]
    assert all(t.logprob <= 0 for t in tokens)
    # a token's text is its bytes, a piece of a multi-byte character shown as \xNN escapes
    assert all(bytes(t.bytes).decode("utf-8", errors="backslashreplace") == t.token for t in tokens)


def test_different_seeds_differ(server):
    api = client(server)
    texts = {
        api.completions.create(
            model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=1.0, seed=s
        )
        .choices[0]
        .text
        for s in (1, 2, 3)
    }
    assert len(texts) > 1


def test_completion_logprobs_format(server):
    out = client(server).completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=8, temperature=0, logprobs=1
    )
    logprobs = out.choices[0].logprobs
    n = out.usage.completion_tokens
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == n
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_token_id_prompts(server, smol_tokenizer):
    api = client(server)
    ids = smol_tokenizer.encode(PROMPTS[0])
    by_text = api.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    by_ids = api.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    by_list = api.completions.create(model=MODEL, prompt=[ids], max_tokens=8, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text == by_list.choices[0].text


def test_stop_string_cuts_the_text(server):
    api = client(server)
    full = (
        api.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0)
        .choices[0]
        .text
    )
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), "the greedy text is too short to pick a stop string from"
    cut = api.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]
    text, _, _ = stream_completion(api, prompt=PROMPTS[1], max_tokens=24, temperature=0, stop=stop)
    assert text == cut.choices[0].text


@pytest.fixture(scope="module")
def offline_llm(tiny_checkpoint) -> LLM:
    return LLM(config=engine_config(), checkpoint=tiny_checkpoint)


def test_greedy_completion_equals_offline_generate(server, offline_llm):
    api = client(server)
    offline = offline_llm.generate(PROMPTS, SamplingParams(max_tokens=20, temperature=0))
    for prompt, expected in zip(PROMPTS, offline, strict=True):
        out = api.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
        assert out.choices[0].text == expected.text
        assert out.usage.completion_tokens == len(expected.token_ids)


def test_greedy_chat_equals_offline_chat(server, offline_llm):
    expected = offline_llm.chat(CHAT, SamplingParams(max_tokens=20, temperature=0))[0]
    out = client(server).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=20, temperature=0
    )
    assert out.choices[0].message.content == expected.text
    assert out.usage.prompt_tokens == expected.num_prompt_tokens


@pytest.mark.parametrize("spec_server", ["ngram_server", "draft_server"])
def test_speculative_greedy_equals_plain(server, spec_server, request):
    speculative = request.getfixturevalue(spec_server)
    plain_api, spec_api = client(server), client(speculative)
    repetitive = "a b c a b c a b c a b c"  # n-gram proposals find matches here
    drafted = 0
    for prompt in [*PROMPTS, repetitive]:
        kwargs = dict(
            model=MODEL,
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        plain = plain_api.completions.create(**kwargs)
        spec = spec_api.completions.create(**kwargs)
        assert spec.choices[0].text == plain.choices[0].text
        assert spec.usage.completion_tokens == plain.usage.completion_tokens == 24
        drafted += spec.speculation["draft_tokens"]
    text, _, usage = stream_chat(spec_api, messages=CHAT, max_tokens=16, temperature=0)
    assert (
        text
        == plain_api.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=16, temperature=0
        )
        .choices[0]
        .message.content
    )
    assert drafted > 0


def test_draft_model_that_is_the_target_accepts_everything(draft_server):
    out = client(draft_server).completions.create(
        model=MODEL,
        prompt=PROMPTS[0],
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    spec = out.speculation
    assert spec["draft_tokens"] > 0 and spec["accepted_tokens"] == spec["draft_tokens"]
    assert spec["tau"] > 2
