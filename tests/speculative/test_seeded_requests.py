"""A seeded sampling request is reproducible under speculation: its tokens are the same alone
and inside a batch of unseeded requests, in an engine with another engine seed (so nothing of
it may come from the engine's generator or depend on its neighbours), for draft-target with
sampled and greedy drafts, n-gram (its cross-request store on), MTP with greedy and sampled
drafts, and EAGLE trees (static, dynamic, siblings sampled from the head); and they are its
plain decoding tokens, whatever k (adaptive included) or tree."""

from __future__ import annotations

import pytest
from testkit import fit_head, tiny_hf_model, tiny_llm

from speculant import SamplingParams

TINY = dict(vocab_size=16, bos_token_id=1, eos_token_id=2)  # n-gram drafts get accepted too
SEEDED_PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]
SEEDED = SamplingParams(max_tokens=40, temperature=0.8, top_k=40, seed=1234, ignore_eos=True)
OTHERS = [  # unseeded neighbours, finishing at different steps so the batch shrinks under it
    ([9, 10, 11, 9, 10, 12], SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)),
    ([3, 4, 3, 4, 3, 4, 3], SamplingParams(max_tokens=50, temperature=0.7, top_p=0.9, ignore_eos=True)),
    ([13, 14, 15], SamplingParams(max_tokens=25, temperature=1.0, min_p=0.05, ignore_eos=True)),
]
TREE = dict(speculative="eagle", tree_depth=3, tree_topk=2, num_draft_tokens=6)
METHODS = {
    "draft-sampled": dict(speculative="draft", draft_sampling="sample"),
    "draft-greedy": dict(speculative="draft", draft_sampling="greedy"),
    "ngram": dict(speculative="ngram"),
    "mtp": dict(speculative="mtp"),
    "mtp-sampled": dict(speculative="mtp", head_sampling="sample"),
    "eagle-static": dict(TREE, tree="static"),
    "eagle-dynamic": dict(TREE, tree="dynamic"),
    "eagle-sampled-siblings": dict(TREE, tree="static", head_sampling="sample"),
}


@pytest.fixture(scope="module")
def models():
    """The target, a weaker draft model, and a head fitted on the target's greedy continuation
    of the seeded prompt (so some drafts are accepted)."""
    target = tiny_hf_model("llama", seed=1, **TINY)
    plain = tiny_llm(target).generate([SEEDED_PROMPT], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    head = fit_head(target, [SEEDED_PROMPT + plain.token_ids], steps=100)
    return target, tiny_hf_model("llama", seed=7, num_hidden_layers=1, **TINY), head


def _llm(models, method: str, seed: int, adaptive_k: bool = False):
    target, draft, head = models
    options = {"num_draft_tokens": 3, **METHODS[method]}
    if options["speculative"] == "draft":
        return tiny_llm(target, draft, seed=seed, adaptive_k=adaptive_k, **options)
    if options["speculative"] in ("mtp", "eagle"):
        options["draft_checkpoint"] = head
    return tiny_llm(target, seed=seed, adaptive_k=adaptive_k, **options)


@pytest.mark.parametrize("method", list(METHODS))
def test_seeded_request_alone_equals_in_a_batch(models, method):
    alone = _llm(models, method, seed=1).generate([SEEDED_PROMPT], SEEDED)[0]
    prompts = [OTHERS[0][0], SEEDED_PROMPT, *[p for p, _ in OTHERS[1:]]]
    params = [OTHERS[0][1], SEEDED, *[sp for _, sp in OTHERS[1:]]]
    batched = _llm(models, method, seed=2).generate(prompts, params)[1]
    assert batched.token_ids == alone.token_ids
    assert alone.stats.draft_tokens > 0 and batched.stats.draft_tokens > 0
    assert 0 < alone.stats.accepted_tokens < alone.stats.draft_tokens  # rejections happened too


@pytest.mark.parametrize("method", list(METHODS))
def test_speculation_leaves_a_seeded_request_unchanged(models, method):
    """A seeded request's tokens are its plain-decoding tokens under any method, k and tree
    (fixed, then adaptive with batch-mates), the n-gram store on: each position's token is the
    target's keyed sample, whatever was drafted."""
    plain = tiny_llm(models[0], seed=3).generate([SEEDED_PROMPT], SEEDED)[0].token_ids
    out = _llm(models, method, seed=4).generate([SEEDED_PROMPT], SEEDED)[0]
    assert out.token_ids == plain
    assert 0 < out.stats.accepted_tokens < out.stats.draft_tokens
    prompts, params = [SEEDED_PROMPT, *[p for p, _ in OTHERS]], [SEEDED, *[sp for _, sp in OTHERS]]
    assert _llm(models, method, seed=5, adaptive_k=True).generate(prompts, params)[0].token_ids == plain
