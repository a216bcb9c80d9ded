"""MTP speculative sampling reproduces the target's own distribution (joints of the first
tokens and the bonus tokens, as in test_spec_sampling), with a normed and an eagle3 head, with
prompt lookup's one-hot copies among the head's drafts, and a broken rule is caught."""

from __future__ import annotations

import pytest
import torch
from test_spec_sampling import (
    ALPHA,
    NUM_DRAFTS,
    PROMPT,
    SAMPLING_ENGINE,
    TINY,
    VOCAB,
    _always_accept,
    bonus_pvalue,
    exact_joints,
    run_samples,
)
from testkit import chi_square_pvalue, fit_head, record_offer_kinds, tiny_hf_model, tiny_llm

import speculant.engine.chain_verify as verify_module
from speculant import SamplingParams

PARAMS = SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=0.8, top_k=12, ignore_eos=True)


def _models(variant: str):
    """The sampling test's target with a head fitted on a few of its own greedy continuations."""
    target = tiny_hf_model("llama", seed=1, **TINY)
    with torch.no_grad():
        target.lm_head.weight.mul_(2.5)  # as test_spec_sampling's target
    plain = tiny_llm(target).generate([PROMPT, [4, 4], [9, 8, 7]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    head = fit_head(target, [p + o.token_ids for p, o in zip([PROMPT, [4, 4], [9, 8, 7]], plain)], variant=variant, steps=100)
    return target, head


@pytest.fixture(scope="module")
def mtp_models():
    return _models("normed")


def mtp_p_values(mtp_models, **options) -> dict[str, float]:
    target, head = mtp_models
    llm = tiny_llm(target, speculative="mtp", draft_checkpoint=head, head_sampling="sample", **SAMPLING_ENGINE, **options)
    run = run_samples(llm, PARAMS)
    x = run.tokens
    pairs = [x[:, 0] * VOCAB + x[:, 1], x[:, 1] * VOCAB + x[:, 2], x[:, 2] * VOCAB + x[:, 3]]
    out = {f"x{i + 1}x{i + 2}": chi_square_pvalue(c, j) for i, (c, j) in enumerate(zip(pairs, exact_joints(target, PARAMS)))}
    out["bonus"] = bonus_pvalue(target, PARAMS, run.bonuses)
    return out


def test_mtp_sampling_matches_target(mtp_models):
    out = mtp_p_values(mtp_models)
    assert min(out.values()) > ALPHA, out


def test_mtp_sampling_with_an_eagle3_head_matches_target():
    out = mtp_p_values(_models("eagle3"))
    assert min(out.values()) > ALPHA, out


def test_mtp_sampling_with_prompt_lookup_matches_target(mtp_models, monkeypatch):
    """head_lookup 1: a draft copies wherever the last token occurred before (the prompt's 3, 5, 7
    or a repeat), the head drafts elsewhere; both kinds are verified by the one rule."""
    from speculant.speculative.mtp import MtpProposer

    kinds = record_offer_kinds(MtpProposer, monkeypatch)
    out = mtp_p_values(mtp_models, head_lookup=1)
    assert min(out.values()) > ALPHA, out
    assert 0 < sum(kind is not None for kind in kinds) < len(kinds)  # copies and head drafts both


def test_mtp_broken_acceptance_rule_is_detected(mtp_models, monkeypatch):
    monkeypatch.setattr(verify_module, "accept_drafts", _always_accept)
    out = mtp_p_values(mtp_models)
    assert min(out["x1x2"], out["x2x3"]) < 1e-9, out
