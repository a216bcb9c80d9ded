"""Greedy speculation is exact in every weight mode: the tokens of n-gram, draft-target, MTP (with
and without prompt lookup's copies) and EAGLE (static and dynamic trees) equal plain decoding's token for token with fp32, bf16, int8
and int4 weights, alone and in a batch of 8 (with an eagle3 head too, reading the target's
feature layers, in every mode); and a request's plain tokens are the same alone and
beside other requests. Exactness, not closeness: the forward is row-invariant
(tests/executor/test_batch_invariance.py), so no near-tie may excuse a parting."""

from __future__ import annotations

import pytest
from testkit import fit_head, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)")

MODES = ["fp32", "bf16", "int8", "int4"]
TINY = dict(vocab_size=32, bos_token_id=1, eos_token_id=2, hidden_size=64, intermediate_size=128)
PROMPTS = [[5, 9, 12, 5, 9, 12, 5, 9], [3, 4, 5, 6, 3, 4, 5], [7] * 6, [10, 11, 12, 13, 10, 11],
           [20, 21, 20, 21, 20], [30, 31, 3], [8, 18, 28, 8, 18], [6, 16, 26, 6, 16, 26]]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
TREE = dict(speculative="eagle", tree_depth=3, tree_topk=2, num_draft_tokens=6)
METHODS = {
    "ngram": dict(speculative="ngram", num_draft_tokens=4),
    "draft": dict(speculative="draft", num_draft_tokens=3),
    "mtp": dict(speculative="mtp", num_draft_tokens=2),
    "mtp-lookup": dict(speculative="mtp", num_draft_tokens=3, head_lookup=2),  # copies beside the head's drafts
    "eagle-static": dict(TREE, tree="static"),
    "eagle-dynamic": dict(TREE, tree="dynamic"),
}


@pytest.fixture(scope="module")
def models():
    """The target, a weaker draft, and a head fitted on the target's greedy continuations (so
    drafts of every method are accepted at times and rejected at others)."""
    target = tiny_hf_model("llama", seed=2, **TINY)
    plain = tiny_llm(target).generate(PROMPTS[:4], GREEDY)
    head = fit_head(target, [p + o.token_ids for p, o in zip(PROMPTS, plain)], steps=100)
    return target, tiny_hf_model("llama", seed=9, num_hidden_layers=1, **TINY), head


def _llm(models, weights: str, method: str | None = None):
    target, draft, head = models
    if method is None:
        return tiny_llm(target, weights=weights)
    options = dict(METHODS[method])
    if options["speculative"] == "draft":
        return tiny_llm(target, draft, weights=weights, **options)
    if options["speculative"] in ("mtp", "eagle"):
        options["draft_checkpoint"] = head
    return tiny_llm(target, weights=weights, **options)


def _tokens(llm, prompts) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.fixture(scope="module")
def eagle3_head(models):
    """An eagle3 head fitted like the normed one (drafts accepted at times, rejected at others)."""
    target = models[0]
    plain = tiny_llm(target).generate(PROMPTS[:4], GREEDY)
    return fit_head(target, [p + o.token_ids for p, o in zip(PROMPTS, plain)], variant="eagle3", steps=100)


@pytest.fixture(scope="module")
def plain(models):
    return {mode: _tokens(_llm(models, mode), PROMPTS) for mode in MODES}


@pytest.mark.parametrize("weights", MODES)
def test_plain_tokens_are_the_same_alone_and_in_a_batch(models, plain, weights):
    llm = _llm(models, weights)
    assert [_tokens(llm, [p])[0] for p in PROMPTS] == plain[weights]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("weights", MODES)
def test_greedy_speculation_equals_plain_in_every_weight_mode(models, plain, weights, method):
    llm = _llm(models, weights, method)
    assert _tokens(llm, PROMPTS[:1]) == plain[weights][:1]
    assert _tokens(llm, PROMPTS) == plain[weights]
    stats = llm.stats()
    assert stats["draft_tokens"] > 0 and 0 < stats["accepted_tokens"] < stats["draft_tokens"], stats


@pytest.mark.parametrize("method", ["mtp", "eagle-static", "eagle-dynamic"])
@pytest.mark.parametrize("weights", MODES)
def test_greedy_speculation_with_an_eagle3_head_equals_plain(models, eagle3_head, plain, weights, method):
    llm = _llm((models[0], models[1], eagle3_head), weights, method)
    assert llm.engine.executor._features == {"target": (1, 1, 0)}  # the tiny target's 2 layers: the default, brought in
    assert _tokens(llm, PROMPTS[:1]) == plain[weights][:1]
    assert _tokens(llm, PROMPTS) == plain[weights]
    stats = llm.stats()
    assert stats["draft_tokens"] > 0 and 0 < stats["accepted_tokens"] < stats["draft_tokens"], stats


def test_the_weight_modes_compute_different_targets(plain):
    """The tests above would be hollow if the modes were one model: the quantized modes part
    from fp32 somewhere."""
    assert plain["int4"] != plain["fp32"]
