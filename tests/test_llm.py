"""`LLM(...)` takes every engine option as a keyword, and they reach the engine."""

from __future__ import annotations

import inspect

import pytest
from testkit import tiny_hf_model, tiny_llm

from speculant import LLM, SamplingParams
from speculant.config import EngineConfig, NgramConfig
from speculant.config_options import engine_options


def test_signature_lists_every_engine_option():
    params = inspect.signature(LLM).parameters
    assert list(params)[0] == "model"
    for opt in engine_options():
        assert params[opt.name].default == opt.default


def test_keyword_mistakes_fail_before_loading_anything():
    with pytest.raises(TypeError, match="'draft_models'.*did you mean 'draft_model'"):
        LLM(draft_models="x")
    with pytest.raises(TypeError, match="not both.*page_size"):
        LLM(config=EngineConfig(), page_size=4)
    with pytest.raises(TypeError, match="not both.*model"):
        LLM("smollm2-135m", config=EngineConfig())


def test_keywords_land_in_the_engine_config():
    llm = tiny_llm(tiny_hf_model("llama"), speculative="ngram", ngram_max_n=5, ngram_min_n=3, max_waiting=7)
    assert llm.config.model.model == "tiny" and llm.config.cache.page_size == 4
    assert llm.config.speculative.ngram == NgramConfig(max_n=5, min_n=3)
    assert llm.config.scheduler.max_waiting == 7


def test_ngram_settings_reach_the_ngram_proposer():
    """Repetitive prompts give 1-4 token matches; asking for 64-token matches leaves none."""
    model = tiny_hf_model("qwen2")
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], list(range(10, 30)) * 2, [8, 8, 8, 8, 8]]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    drafts = {}
    for n in (1, 64):
        llm = tiny_llm(model, speculative="ngram", ngram_min_n=n, ngram_max_n=max(n, 4))  # fixed k (tiny_llm)
        llm.generate(prompts, params)
        drafts[n] = llm.stats()["draft_tokens"]
    assert drafts[1] > 0 and drafts[64] == 0
