"""Constrained sampling under speculation is distributed exactly as constrained plain sampling.

The grammar is the regex [ab]{1,3}: the target's 128-token vocabulary (SmolLM2's ids, 17-116
single ASCII characters) spells it only with "a", "b" and EOS, so each output string is one token
path and its probability is computable by enumeration: at each prefix of length L the target's
law renormalised over {a, b} (L < 3) and EOS (L >= 1), written out here from the regex, not
taken from the engine's masks. The target favours a, b, c and EOS, so drafts of every method
are often in the grammar and sometimes refused by it ("c", an early EOS). Pearson chi-square at
ALPHA; masks applied one position early (a node's row masked by its parent's state) must fail.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from testkit import TinyCheckpoint, chi_square_pvalue, fit_head, noisy_copy, tiny_hf_model

import speculant.engine.logit_rows as logit_rows
from speculant import LLM, SamplingParams, StructuredOutput

ALPHA = 1e-3
NUM_SAMPLES = 2000
VOCAB = 128
A, B, C, EOS = 81, 82, 83, 2  # "a", "b", "c" and </s> in SmolLM2's vocabulary
PROMPT = [40, 81, 82, 81, 82, 50]
PARAMS = SamplingParams(max_tokens=4, temperature=1.0, structured_output=StructuredOutput("regex", "[ab]{1,3}"))
OUTCOMES = ["".join(s) for n in (1, 2, 3) for s in itertools.product("ab", repeat=n)]
METHODS = {
    "ngram": dict(speculative="ngram", num_draft_tokens=3),
    "draft": dict(speculative="draft", num_draft_tokens=3, draft_model="tiny-draft"),
    "mtp": dict(speculative="mtp", num_draft_tokens=2),
    "eagle": dict(speculative="eagle", tree_depth=3, tree_topk=2, num_draft_tokens=5, tree="static"),
}


@pytest.fixture(scope="module")
def models():
    from speculant.loader import load_checkpoint

    tokenizer = load_checkpoint("smollm2-135m").tokenizer
    target = tiny_hf_model("llama", seed=4, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
    with torch.no_grad():
        target.lm_head.weight[[A, B, C, EOS]] *= 6.0
    plain = _llm((target, None, None, tokenizer)).generate([PROMPT, [A, A, B]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    head = fit_head(target, [p + o.token_ids for p, o in zip([PROMPT, [A, A, B]], plain)], steps=100)
    return target, noisy_copy(target, scale=0.003), head, tokenizer


def _llm(models, method: str | None = None) -> LLM:
    target, draft, head, tokenizer = models
    options = dict(METHODS[method]) if method else {}
    if method == "draft":
        options["draft_checkpoint"] = TinyCheckpoint(draft, tokenizer)
    elif method in ("mtp", "eagle"):
        options["draft_checkpoint"] = head
    engine = dict(adaptive_k=False, seed=11, num_pages=4096, max_num_seqs=512, max_num_batched_tokens=8192)
    return LLM(model="tiny", checkpoint=TinyCheckpoint(target, tokenizer), **engine, **options)


def exact_law(target) -> torch.Tensor:
    """[len(OUTCOMES) + 1] P(output string) under constrained plain sampling at temperature 1,
    then 0 for any other outcome (a string off the grammar, an error)."""
    law = []
    for text in OUTCOMES:
        ids, p = [{"a": A, "b": B}[ch] for ch in text], 1.0
        for i, token in enumerate([*ids, EOS]):
            allowed = ([A, B] if i < 3 else []) + ([EOS] if i >= 1 else [])
            with torch.no_grad():
                logits = target(torch.tensor([PROMPT + ids[:i]])).logits[0, -1].double()
            p *= logits[allowed].softmax(-1)[allowed.index(token)].item()
        law.append(p)
    return torch.tensor([*law, 0.0])


def sample_outcomes(llm: LLM) -> torch.Tensor:
    outs = llm.generate([PROMPT] * NUM_SAMPLES, [PARAMS] * NUM_SAMPLES)
    return torch.tensor([OUTCOMES.index(o.text) if o.finish_reason == "stop" and o.text in OUTCOMES else len(OUTCOMES) for o in outs])


@pytest.fixture(scope="module")
def law(models):
    return exact_law(models[0])


def test_constrained_plain_sampling_matches_the_enumerated_law(models, law):
    assert chi_square_pvalue(sample_outcomes(_llm(models)), law) > ALPHA


@pytest.mark.parametrize("method", list(METHODS))
def test_constrained_speculative_sampling_matches_the_enumerated_law(models, law, method):
    llm = _llm(models, method)
    p = chi_square_pvalue(sample_outcomes(llm), law)
    stats = llm.stats()
    assert stats["draft_tokens"] > stats["accepted_tokens"] > 0, {k: stats[k] for k in ("draft_tokens", "accepted_tokens")}  # drafts accepted and refused
    assert p > ALPHA, p


def test_masks_one_position_early_are_caught(models, law, monkeypatch):
    right = logit_rows.tree_masks

    def early(matcher, tokens, parents, out, ends=frozenset()):
        right(matcher, tokens, parents, out, ends)
        for i, parent in enumerate(parents):
            out[i + 1] = out[parent + 1]  # node i's row gets its parent's state

    monkeypatch.setattr(logit_rows, "tree_masks", early)
    assert chi_square_pvalue(sample_outcomes(_llm(models, "draft")), law) < 1e-9
