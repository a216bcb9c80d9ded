"""Counts are exact under speculation: when a stop string completes inside accepted drafts, every
method (n-gram, draft model, MTP, EAGLE) keeps the tokens plain decoding keeps, with their
logprobs, and counts them alike (the engine's emitted tokens, the request's accepted drafts);
drafts never run past max_tokens.

The target has a 128-token vocabulary read through SmolLM2's tokenizer, whose ids 17-116 are
single ASCII characters, so a short stop string spans several tokens that one step can emit.
"""

from __future__ import annotations

import pytest
from testkit import TinyCheckpoint, fit_head, noisy_copy, tiny_hf_model

from speculant import LLM, SamplingParams

TINY = dict(vocab_size=128, bos_token_id=1, eos_token_id=2)
PROMPTS = [[40, 50, 60, 40, 50, 60, 40, 50], [70, 71, 72, 73, 70, 71, 72], [90] * 6, [33, 44, 55, 66, 33, 44]]
METHODS = {
    "ngram": dict(speculative="ngram", num_draft_tokens=4),
    "draft": dict(speculative="draft", num_draft_tokens=3, draft_model="tiny-draft"),
    "mtp": dict(speculative="mtp", num_draft_tokens=2),
    "eagle-static": dict(speculative="eagle", tree_depth=3, tree_topk=2, num_draft_tokens=6, tree="static"),
    "eagle-dynamic": dict(speculative="eagle", tree_depth=3, tree_topk=2, num_draft_tokens=6, tree="dynamic"),
}


def _params(max_tokens: int = 40, stop: tuple[str, ...] = ()) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop=stop, logprobs=True, top_logprobs=2)


@pytest.fixture(scope="module")
def models(smol_tokenizer):
    target = tiny_hf_model("llama", seed=2, **TINY)
    plain = _llm((target, None, None, smol_tokenizer)).generate(PROMPTS, _params())
    head = fit_head(target, [p + o.token_ids for p, o in zip(PROMPTS, plain)], steps=100)
    return target, noisy_copy(target), head, smol_tokenizer


def _llm(models, method: str | None = None) -> LLM:
    target, draft, head, tokenizer = models
    options = dict(METHODS[method]) if method else {}
    if options.get("speculative") == "draft":
        options["draft_checkpoint"] = TinyCheckpoint(draft, tokenizer)
    elif options.get("speculative") in ("mtp", "eagle"):
        options["draft_checkpoint"] = head
    return LLM(model="tiny", checkpoint=TinyCheckpoint(target, tokenizer), adaptive_k=False, page_size=4, num_pages=256, **options)


def _stops(texts: list[str]) -> list[tuple[str, ...]]:
    """Distinct stop strings of 2-4 characters taken from along the plain outputs."""
    out = []
    for text in texts:
        for start in range(2, len(text) - 4, max(1, len(text) // 6)):
            out.append((text[start : start + 2 + start % 3],))
    return list(dict.fromkeys(out))


def _seen(out) -> tuple:
    stats = out.stats
    return out.text, out.token_ids, out.logprobs, out.top_logprobs, out.finish_reason, stats.num_output_tokens


def _record_cuts(llm: LLM) -> list[tuple[int, int]]:
    """(tokens a step emitted, tokens kept) of every commit that ended on a stop string."""
    cuts, append = [], llm.engine.outputs.append

    def recording(req, tokens, *args):
        kept = append(req, tokens, *args)
        if req.finished and req.status.value == "stop" and len(kept) < len(tokens):
            cuts.append((len(tokens), len(kept)))
        return kept

    llm.engine.outputs.append = recording
    return cuts


@pytest.fixture(scope="module")
def plain_runs(models):
    llm = _llm(models)
    texts = [o.text for o in llm.generate(PROMPTS, _params())]
    stops = _stops(texts)
    runs = {stop: [_seen(o) for o in llm.generate(PROMPTS, _params(stop=stop))] for stop in stops}
    return runs, llm.stats()["generated_tokens"]


@pytest.mark.parametrize("method", list(METHODS))
def test_a_stop_inside_accepted_drafts_keeps_what_plain_decoding_keeps(models, plain_runs, method):
    runs, plain_generated = plain_runs
    llm = _llm(models, method)
    llm.generate(PROMPTS, _params())  # the same warm-up as the plain run's
    cuts = _record_cuts(llm)
    for stop, expected in runs.items():
        outs = llm.generate(PROMPTS, _params(stop=stop))
        assert [_seen(o) for o in outs] == expected, stop
        for o in outs:
            assert o.stats.accepted_tokens <= o.stats.num_output_tokens - 1, (stop, o.stats)
    stats = llm.stats()
    assert stats["generated_tokens"] == plain_generated
    assert stats["accepted_tokens"] > 0
    assert cuts, "no stop string completed inside a step's accepted drafts: the test proves nothing"


@pytest.mark.parametrize("method", list(METHODS))
def test_drafts_stay_inside_max_tokens(models, method):
    plain = _llm(models)
    llm = _llm(models, method)
    for max_tokens in range(1, 9):
        expected = [_seen(o) for o in plain.generate(PROMPTS, _params(max_tokens))]
        outs = llm.generate(PROMPTS, _params(max_tokens))
        assert [_seen(o) for o in outs] == expected, max_tokens
        for o in outs:
            assert o.stats.accepted_tokens <= max_tokens - 1, (max_tokens, o.stats)
            if max_tokens <= 2:  # the first token comes from the prefill, the second has no room for a draft
                assert o.stats.draft_tokens == 0, (max_tokens, o.stats)
    assert llm.stats()["generated_tokens"] == plain.stats()["generated_tokens"]
    assert llm.stats()["accepted_tokens"] > 0
