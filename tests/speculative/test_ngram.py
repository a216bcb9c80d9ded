"""The n-gram proposer: lossless on the shared speculation framework, near the context's end and
a full cache, through preemption. (The lookup itself: test_lookup.)"""

from __future__ import annotations

from testkit import tiny_hf_model, tiny_llm

from speculant import SamplingParams


def test_indexes_survive_preemption_and_are_released():
    """A small cache preempts requests (their index is dropped and rebuilt on readmission);
    output stays the plain greedy one and no index outlives its request."""
    model = tiny_hf_model("llama")
    prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 8, 9, 8, 9], [4, 4, 4, 4, 4, 4]]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    plain = tiny_llm(model).generate(prompts, params)
    llm = tiny_llm(model, speculative="ngram", num_draft_tokens=3, num_pages=10)
    spec = llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert llm.stats()["preemptions"] > 0 and llm.stats()["draft_tokens"] > 0
    assert llm.engine.proposer.lookup._indexes == {}


def test_ngram_greedy_equals_plain():
    model = tiny_hf_model("qwen2")
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], list(range(10, 30)) * 2, [3], [8, 8, 8, 8, 8]]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    plain = tiny_llm(model).generate(prompts, params)
    llm = tiny_llm(model, speculative="ngram", num_draft_tokens=4)  # fixed k (tiny_llm); adaptive k: test_adaptive.py
    spec = llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert llm.stats()["draft_tokens"] > 0
    assert llm.stats()["kv_pages_used"] == 0


def test_speculation_near_the_context_end_and_a_full_cache():
    """k shrinks so drafts never pass the context (512) nor the whole cache."""
    model = tiny_hf_model("llama")
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    prompt = [5, 6, 7, 8] * 126 + [5]  # 505 tokens of repeats: n-gram proposes long drafts
    plain = tiny_llm(model).generate([prompt], params)[0]
    spec = tiny_llm(model, speculative="ngram", num_draft_tokens=8).generate([prompt], params)[0]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "length"
    small = [5, 6, 7] * 3
    plain = tiny_llm(model, num_pages=4).generate([small], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    spec = tiny_llm(model, num_pages=4, speculative="ngram", num_draft_tokens=4).generate(
        [small], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    )[0]
    assert spec.token_ids == plain.token_ids
