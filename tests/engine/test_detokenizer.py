"""Incremental detokenization with SmolLM2's real tokenizer: at every step the text equals
decoding the whole output at once (emoji, CJK, UTF-8 split over byte tokens, skipped special
tokens), the streamed text and stop-string cuts are those of whole-output decoding, and the
tokens decoded per step do not grow with the output's length."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speculant.core import Request, RequestStatus
from speculant.engine.detokenizer import MAX_PENDING_TOKENS, IncrementalDetokenizer
from speculant.engine.output import OutputProcessor, _first_stop, _longest
from speculant.loader.gguf_tokenizer import byte_alphabet
from speculant.sampling.params import SamplingParams

TEXTS = [
    "Hello, world! Don't stop .",
    "naïve café — déjà vu",
    "😀👍🏽 emoji 🇫🇷 flags",
    "世界你好，日本語のテキスト。한국어",
    "def f(x):\n    return x ** 2  # tabs\tand spaces   ",
    "\u200b zero width, \ufffd a real replacement char",
]
SPECIAL = list(range(17))  # <|endoftext|>, <|im_start|>, ...: dropped by skip_special_tokens
BYTES = range(17, 273)  # the byte-level alphabet: one token per byte, often partial UTF-8


@pytest.fixture(scope="module")
def tokenizer():
    from speculant.loader import load_checkpoint

    return load_checkpoint("smollm2-135m").tokenizer


class CountingTokenizer:
    """The tokenizer, counting the token ids passed to `decode`."""

    def __init__(self, inner) -> None:
        self.inner, self.decoded = inner, 0

    def decode(self, token_ids, **kwargs) -> str:
        self.decoded += len(token_ids)
        return self.inner.decode(token_ids, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _full(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def _utf8_byte_tokens(tokenizer, text: str) -> list[int]:
    """`text` spelled one byte token at a time (characters split over tokens)."""
    alphabet = byte_alphabet()  # byte -> its character in the byte-level vocabulary
    return [tokenizer.convert_tokens_to_ids(alphabet[b]) for b in text.encode()]


@st.composite
def token_streams(draw, tokenizer):
    pieces = draw(st.lists(st.sampled_from(["text", "bytes", "special", "byte", "any"]), min_size=1, max_size=8))
    ids: list[int] = []
    for kind in pieces:
        if kind == "text":
            ids += tokenizer.encode(draw(st.sampled_from(TEXTS)), add_special_tokens=False)
        elif kind == "bytes":
            ids += _utf8_byte_tokens(tokenizer, draw(st.sampled_from(TEXTS)))
        elif kind == "special":
            ids += draw(st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=3))
        elif kind == "byte":
            ids += draw(st.lists(st.sampled_from(BYTES), min_size=1, max_size=3))
        else:
            ids += draw(st.lists(st.integers(0, len(tokenizer) - 1), min_size=1, max_size=4))
    steps = draw(st.lists(st.integers(1, 6), min_size=len(ids), max_size=len(ids)))
    return ids, steps


def _chunks(ids: list[int], steps: list[int]):
    i = 0
    for n in steps:
        if i >= len(ids):
            return
        yield ids[i : i + n]
        i += n


def test_byte_tokens_spell_text(tokenizer):
    for text in TEXTS:
        assert _full(tokenizer, _utf8_byte_tokens(tokenizer, text)) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_text_equals_whole_decoding_at_every_step(tokenizer, data):
    ids, steps = data.draw(token_streams(tokenizer))
    detok, seen = IncrementalDetokenizer(tokenizer), []
    for chunk in _chunks(ids, steps):
        seen += chunk
        assert detok.update(seen) == _full(tokenizer, seen)


class WholeDecodingProcessor(OutputProcessor):
    """The reference: decode the whole output every step."""

    def _update_text(self, req, state) -> None:
        text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        cut = _first_stop(text, req.params.stop, start=max(0, len(state.text) - _longest(req.params.stop)))
        if cut is not None:
            text = text[:cut]
            req.status = RequestStatus.FINISHED_STOPPED
        state.text = text


def _run(processor: OutputProcessor, ids: list[int], steps: list[int], stop: tuple[str, ...]) -> list[tuple]:
    req = Request("r", [5], SamplingParams(max_tokens=len(ids), stop=stop, ignore_eos=True), status=RequestStatus.RUNNING)
    outs = []
    for chunk in _chunks(ids, steps):
        new = processor.append(req, chunk, None)
        out = processor.make_output(req, new)
        outs.append((out.text, out.new_text, out.finished, out.finish_reason))
        if req.finished:
            break
    return outs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_streaming_and_stop_strings_as_with_whole_decoding(tokenizer, data):
    ids, steps = data.draw(token_streams(tokenizer))
    text = _full(tokenizer, ids)
    stops = data.draw(st.lists(st.sampled_from([text[i : i + n] for i in range(len(text)) for n in (1, 2, 3, 5)] + ["ü", "。", "zz"]), max_size=2))
    stop = tuple(s for s in stops if s)
    ours = _run(OutputProcessor(tokenizer, 10**6), ids, steps, stop)
    assert ours == _run(WholeDecodingProcessor(tokenizer, 10**6), ids, steps, stop)
    assert "".join(o[1] for o in ours) == ours[-1][0]


def test_decoded_tokens_per_step_do_not_grow(tokenizer):
    """Decoding 3,000 tokens a few at a time touches a bounded number of tokens per step."""
    ids = []
    for i in range(120):
        ids += tokenizer.encode(TEXTS[i % len(TEXTS)], add_special_tokens=False)
        ids += _utf8_byte_tokens(tokenizer, TEXTS[(i * 7) % len(TEXTS)])[:9] + SPECIAL[: i % 3]
    counting = CountingTokenizer(tokenizer)
    detok, seen, per_step = IncrementalDetokenizer(counting), [], []
    for chunk in _chunks(ids, [1 + i % 5 for i in range(len(ids))]):
        seen += chunk
        before = counting.decoded
        detok.update(seen)
        per_step.append(counting.decoded - before)
    assert len(seen) > 3000 and detok.text == _full(tokenizer, seen)
    quarter = len(per_step) // 4  # the stream is periodic: the last quarter costs what the first did
    assert max(per_step[-quarter:]) <= max(per_step[:quarter])
    assert sum(per_step) <= 20 * len(seen)  # whole-output decoding: about len(seen)**2 / 6


def test_a_4096_token_generation_decodes_a_bounded_window_per_step(tokenizer):
    """A tiny random model with the real tokenizer (all of its vocabulary, special tokens and
    byte tokens included) generates 4,096 tokens; each step decodes a bounded number."""
    from testkit import TinyCheckpoint, tiny_hf_model

    from speculant import LLM

    model = tiny_hf_model("llama", vocab_size=len(tokenizer), max_position_embeddings=4200)
    counting = CountingTokenizer(tokenizer)
    # plain decoding: one token a step, so a step's decode count does not hang on how many tokens
    # adaptive k's timing-driven drafts let a step emit (which varies from machine to machine)
    llm = LLM(model="tiny", checkpoint=TinyCheckpoint(model, counting), page_size=64, num_pages=80, seed=3, speculative="none")
    request = llm.engine.add_request("Once upon a time", SamplingParams(max_tokens=4096, temperature=1.0, ignore_eos=True))
    per_step = []
    while llm.engine.has_unfinished():
        before = counting.decoded
        llm.engine.step()
        per_step.append(counting.decoded - before)
    assert len(request.output_token_ids) == 4096
    decode_steps = per_step[1:]  # the first step is the prompt's prefill
    assert len(decode_steps) == 4095
    assert max(decode_steps) <= 4 * (2 * MAX_PENDING_TOKENS + 2)
    assert max(decode_steps[-1024:]) <= max(decode_steps[:1024])
