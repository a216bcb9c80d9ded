"""Bad requests fail with a ValueError naming the offending field, and leave the engine serving
the requests already in flight exactly as if the bad ones had never been tried."""

from __future__ import annotations

import functools

import pytest
import torch
from testkit import tiny_hf_model, tiny_llm

from speculant.sampling.params import SamplingParams

VOCAB, CONTEXT = 256, 512  # tiny_hf_config's vocab_size and max_position_embeddings


@functools.cache
def _hf():
    return tiny_hf_model("llama", seed=11)


def _greedy(n: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


BAD_PROMPTS = {
    "empty_ids": ([[]], "prompt must not be empty"),  # `[]` alone is an empty list of prompts
    "empty_text": ("", "prompt must not be empty"),
    "text_without_tokenizer": ("hello", "prompt: this model has no tokenizer"),
    "too_long": (
        [3 + i % 250 for i in range(CONTEXT)],
        "prompt is 512 tokens, longer than the model's context of 512",
    ),
    "token_too_large": (
        [1, 5, VOCAB],
        rf"prompt token ids must be in \[0, {VOCAB}\), got \[{VOCAB}\]",
    ),
    "token_negative": ([1, -1, 7], r"prompt token ids must be in \[0, 256\), got \[-1\]"),
}

BAD_PARAMS = {
    "max_tokens_zero": (dict(max_tokens=0), "max_tokens"),
    "max_tokens_negative": (dict(max_tokens=-3), "max_tokens"),
    "max_tokens_float": (dict(max_tokens=2.5), "max_tokens"),
    "temperature_negative": (dict(temperature=-0.1), "temperature"),
    "top_p_zero": (dict(top_p=0.0), "top_p"),
    "top_p_above_one": (dict(top_p=1.5), "top_p"),
    "top_k_negative": (dict(top_k=-1), "top_k"),
    "min_p_above_one": (dict(min_p=2.0), "min_p"),
    "stop_empty_string": (dict(stop=("",)), "stop"),
}


@pytest.mark.parametrize("name", list(BAD_PROMPTS))
def test_bad_prompt_names_the_field(name: str) -> None:
    prompt, message = BAD_PROMPTS[name]
    llm = tiny_llm(_hf())
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, _greedy())
    assert not llm.engine.has_unfinished() and llm.engine.pages.allocator.num_used == 0


@pytest.mark.parametrize("name", list(BAD_PARAMS))
def test_bad_sampling_params_name_the_field(name: str) -> None:
    kwargs, field = BAD_PARAMS[name]
    with pytest.raises(ValueError, match=rf"^{field} "):
        SamplingParams(**kwargs)


def test_prompt_needing_more_pages_than_the_cache() -> None:
    llm = tiny_llm(_hf(), num_pages=3)  # 12 slots
    with pytest.raises(ValueError, match="prompt needs 4 KV pages, the cache has 3"):
        llm.generate(list(range(3, 15)), _greedy())
    assert len(llm.generate(list(range(3, 14)), _greedy(1))[0].token_ids) == 1  # 11 + 1 fits


def test_one_bad_prompt_in_a_batch_adds_none_of_it() -> None:
    llm = tiny_llm(_hf())
    with pytest.raises(ValueError, match="prompt token ids"):
        llm.generate([[1, 2, 3], [4, 5], [1, 999]], _greedy())
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    assert llm.engine.pages.allocator.num_used == 0


def test_no_prompts_no_outputs() -> None:
    assert tiny_llm(_hf()).generate([], _greedy()) == []


def test_mismatched_params_list() -> None:
    llm = tiny_llm(_hf())
    with pytest.raises(ValueError, match="params: got 1 for 2 prompts"):
        llm.generate([[1, 2], [3, 4]], [_greedy()])


def test_duplicate_request_id() -> None:
    engine = tiny_llm(_hf()).engine
    engine.add_request([1, 2, 3], _greedy(), request_id="a")
    with pytest.raises(ValueError, match="request_id 'a' is already in use"):
        engine.add_request([4, 5], _greedy(), request_id="a")


def test_unknown_model_is_named() -> None:
    from speculant import LLM

    with pytest.raises(ValueError, match="no-such-model"):
        LLM(model="no-such-model")


def _good_prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(2)
    return [[1] + torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (4, 11, 2)]


def _serve(bad_attempts: bool) -> dict[str, list[int]]:
    llm = tiny_llm(_hf(), max_num_batched_tokens=8)
    engine = llm.engine
    seeded = SamplingParams(temperature=0.8, max_tokens=12, seed=5, ignore_eos=True)
    ids = [
        engine.add_request(p, sp).request_id
        for p, sp in zip(_good_prompts(), [_greedy(12), seeded, _greedy(12)], strict=True)
    ]
    done = {}
    for step in range(200):
        if bad_attempts and step in (2, 5):
            for prompt, _ in BAD_PROMPTS.values():
                with pytest.raises(ValueError):
                    engine.add_request(prompt[0] if prompt == [[]] else prompt, _greedy())
            with pytest.raises(ValueError):
                engine.add_request([1, 2], SamplingParams(top_p=0.0))
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        if len(done) == len(ids):
            break
    assert set(done) == set(ids) and engine.pages.allocator.num_used == 0
    return done


def test_engine_keeps_serving_after_bad_requests() -> None:
    assert _serve(bad_attempts=True) == _serve(bad_attempts=False)
