"""The real smollm2-135m in the default weight mode ("auto": its Q4_1 GGUF kept quantized): greedy
n-gram, MTP (the shipped head) and EAGLE dynamic trees emit plain decoding's tokens exactly on
10 real chat prompts x 128 tokens, batched; and a request's tokens are the same alone and in the
batch. No near-tie excuses a parting: the forward computes every row as a one-row step does."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from test_real_smollm2 import _chat_prompts

from speculant import LLM, SamplingParams
from speculant.attention.batch import SeqInput
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.kernels import native

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)"),
]

DOCUMENTS = pathlib.Path(__file__).resolve().parents[2] / "data" / "prompts" / "categories.jsonl"
PARAMS = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
COMMON = dict(model="smollm2-135m", weights="auto", page_size=16, max_num_batched_tokens=2048, kv_cache_bytes=256 << 20)
METHODS = {
    "ngram": dict(speculative="ngram", num_draft_tokens=4),
    "mtp": dict(speculative="mtp", num_draft_tokens=3),
    "eagle-dynamic": dict(speculative="eagle", tree="dynamic", tree_depth=3, tree_topk=2, num_draft_tokens=6),
}


@pytest.fixture(scope="module")
def plain():
    llm = LLM(speculative="none", **COMMON)
    prompts = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in _chat_prompts(10)]
    return llm, prompts, [o.token_ids for o in llm.generate(prompts, PARAMS)]


def test_a_request_alone_equals_it_in_the_batch(plain):
    llm, prompts, tokens = plain
    for i in (0, 7):
        assert llm.generate([prompts[i]], PARAMS)[0].token_ids == tokens[i]


def test_a_long_prompt_computes_the_same_however_it_is_chunked(plain):
    """700 tokens of a real document: one prefill chunk, four uneven chunks, and 600 tokens then
    100 one-token steps give the same logits at every position, bit for bit."""
    llm = plain[0]
    rows = [json.loads(line) for line in DOCUMENTS.read_text().splitlines()]
    text = " ".join(r["prompt"] for r in rows if r["category"] == "summarization")
    ids = llm.tokenizer.encode(text)[:700]
    assert len(ids) == 700
    engine = llm.engine
    allocator, page_size = engine.pages.allocator, engine.pages.page_size

    def logits(chunks: list[int]) -> torch.Tensor:  # [700, vocab]
        pages, out, start = allocator.allocate(-(-len(ids) // page_size)), [], 0
        try:
            for n in chunks:
                inputs = [SeqInput(ids[start : start + n], start, pages, logits="all")]
                out.append(engine.executor.run(ForwardPlan(TARGET, inputs)).logits)
                start += n
        finally:
            allocator.free(pages)
        return torch.cat(out)

    whole = logits([700])
    assert torch.equal(logits([256, 300, 1, 143]), whole)
    assert torch.equal(logits([600] + [1] * 100), whole)


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_speculation_equals_plain_on_real_prompts(plain, method):
    _, prompts, tokens = plain
    llm = LLM(adaptive_k=False, **COMMON, **METHODS[method])
    assert [o.token_ids for o in llm.generate(prompts, PARAMS)] == tokens
    assert llm.stats()["accepted_tokens"] > 0
