"""EAGLE tree speculative sampling through the engine reproduces the target's own distribution
(joints of the first tokens and the bonus tokens, as in test_spec_sampling): a static tree of
siblings sampled without replacement from the head, and a dynamic tree of the head's best tokens
under top-p, with a normed head and (static, sampled siblings) an eagle3 head; removing the
sibling residual update is caught."""

from __future__ import annotations

import pytest
import torch
from test_spec_sampling import (
    ALPHA,
    PROMPT,
    SAMPLING_ENGINE,
    TINY,
    VOCAB,
    bonus_pvalue,
    exact_joints,
    run_samples,
)
from testkit import chi_square_pvalue, fit_head, tiny_hf_model, tiny_llm

import speculant.sampling.tree_acceptance as tree_acceptance
from speculant import SamplingParams

TREE = dict(tree_depth=2, tree_topk=3, num_draft_tokens=6)
CASES = {
    "t1-static-sampled-siblings": (SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True), dict(tree="static", head_sampling="sample")),
    "t0.7-top-p-dynamic": (SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, ignore_eos=True), dict(tree="dynamic")),
}


@pytest.fixture(scope="module")
def eagle_models():
    return _models("normed")


def _models(variant: str):
    """The sampling test's target with a head fitted on a few of its own greedy continuations."""
    target = tiny_hf_model("llama", seed=1, **TINY)
    with torch.no_grad():
        target.lm_head.weight.mul_(2.5)  # as test_spec_sampling's target
    prompts = [PROMPT, [4, 4], [9, 8, 7]]
    plain = tiny_llm(target).generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    head = fit_head(target, [p + o.token_ids for p, o in zip(prompts, plain)], variant=variant, steps=100)
    return target, head


def eagle_p_values(eagle_models, case: str) -> dict[str, float]:
    target, head = eagle_models
    params, options = CASES[case]
    engine_options = {**SAMPLING_ENGINE, **TREE, **options}
    llm = tiny_llm(target, speculative="eagle", draft_checkpoint=head, **engine_options)
    run = run_samples(llm, params)
    x = run.tokens
    pairs = [x[:, 0] * VOCAB + x[:, 1], x[:, 1] * VOCAB + x[:, 2], x[:, 2] * VOCAB + x[:, 3]]
    out = {f"x{i + 1}x{i + 2}": chi_square_pvalue(c, j) for i, (c, j) in enumerate(zip(pairs, exact_joints(target, params)))}
    out["bonus"] = bonus_pvalue(target, params, run.bonuses)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_tree_sampling_matches_target(eagle_models, case):
    out = eagle_p_values(eagle_models, case)
    assert min(out.values()) > ALPHA, out


def test_tree_sampling_with_an_eagle3_head_matches_target():
    out = eagle_p_values(_models("eagle3"), "t1-static-sampled-siblings")
    assert min(out.values()) > ALPHA, out


def test_tree_sampling_without_the_sibling_residual_update_is_caught(eagle_models, monkeypatch):
    monkeypatch.setattr(tree_acceptance, "sibling_residual", lambda p, q, q_token: p)
    out = eagle_p_values(eagle_models, "t1-static-sampled-siblings")
    assert min(out["x1x2"], out["x2x3"]) < 1e-9, out
