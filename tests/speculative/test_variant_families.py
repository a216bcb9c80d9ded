"""Speculation over the Llama variants (Qwen3, Gemma 3 with its sliding windows, Phi-3): n-gram
and draft-model (a noisy copy of the target) greedy output equals plain greedy output, with drafts
proposed."""

from __future__ import annotations

import pytest
from testkit import MIXED_PROMPTS, greedy_params, noisy_copy, tiny_hf_model, tiny_llm

GREEDY = greedy_params(32)
PROMPTS = MIXED_PROMPTS[:4]


@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "phi3"])
def test_ngram_and_draft_greedy_equal_plain(kind):
    target = tiny_hf_model(kind)
    plain = [o.token_ids for o in tiny_llm(target, speculative="none").generate(PROMPTS, GREEDY)]
    for llm in (tiny_llm(target, speculative="ngram", num_draft_tokens=3), tiny_llm(target, noisy_copy(target), num_draft_tokens=3)):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
        assert llm.stats()["draft_tokens"] > 0
