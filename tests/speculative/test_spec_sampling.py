"""Speculative sampling through the engine reproduces the target's own distribution.

Tiny-vocabulary models (V = 16) make the exact law of the first generated tokens computable by
enumeration under the target alone. Token 1 comes from prefill; tokens 2 and 3 come from the
first speculative step (accepted drafts, recovered or bonus tokens), so the joint of (x1, x2) and
of (x2, x3) both depend on the acceptance rule. Pearson chi-square at ALPHA with fixed seeds;
a deliberately broken rule (always accept the draft) must fail far below ALPHA.
"""

from __future__ import annotations

import pytest
import torch
from testkit import chi_square_pvalue, tiny_hf_model, tiny_llm

import speculant.engine.engine as engine_module
from speculant import SamplingParams
from speculant.sampling.acceptance import AcceptResult
from speculant.sampling.sampler import SamplingTensors, processed_probs

ALPHA = 1e-3
VOCAB = 16
NUM_SAMPLES = 6000
PROMPT = [3, 5, 7]
TINY = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def models():
    return tiny_hf_model("llama", seed=1, **TINY), tiny_hf_model("llama", seed=7, num_hidden_layers=1, **TINY)


def exact_joints(hf_model, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """P(x1, x2) and P(x2, x3) under the target's own sampling, flattened to [V * V]."""

    def probs(prefixes: list[list[int]]) -> torch.Tensor:  # [n, V]
        with torch.no_grad():
            logits = hf_model(torch.tensor(prefixes)).logits[:, -1].float()
        return processed_probs(logits, SamplingTensors.from_params([params] * len(prefixes)))

    p1 = probs([PROMPT])[0]  # [V]
    p2 = probs([PROMPT + [a] for a in range(VOCAB)])  # [V, V] rows: x1
    p3 = probs([PROMPT + [a, b] for a in range(VOCAB) for b in range(VOCAB)]).view(VOCAB, VOCAB, VOCAB)
    joint12 = p1[:, None] * p2
    joint23 = (joint12[:, :, None] * p3).sum(0)
    return joint12.reshape(-1), joint23.reshape(-1)


def sample_spec(models, params: SamplingParams, draft_sampling: str) -> torch.Tensor:  # [N, 3]
    target, draft = models
    llm = tiny_llm(
        target, draft, num_draft_tokens=2, draft_sampling=draft_sampling, seed=11,
        num_pages=4096, max_num_seqs=1024, max_num_batched_tokens=8192,
    )
    outs = llm.generate([PROMPT] * NUM_SAMPLES, params)
    assert llm.stats()["draft_tokens"] > 0
    return torch.tensor([o.token_ids for o in outs])


def p_values(models, params: SamplingParams, draft_sampling: str) -> tuple[float, float]:
    tokens = sample_spec(models, params, draft_sampling)
    joint12, joint23 = exact_joints(models[0], params)
    return (
        chi_square_pvalue(tokens[:, 0] * VOCAB + tokens[:, 1], joint12),
        chi_square_pvalue(tokens[:, 1] * VOCAB + tokens[:, 2], joint23),
    )


CASES = {
    "t1-sampled-draft": (SamplingParams(max_tokens=3, temperature=1.0, ignore_eos=True), "sample"),
    "t0.7-topk-topp-greedy-draft": (
        SamplingParams(max_tokens=3, temperature=0.7, top_k=10, top_p=0.9, ignore_eos=True),
        "greedy",
    ),
    "t0.7-minp-sampled-draft": (SamplingParams(max_tokens=3, temperature=0.7, min_p=0.05, ignore_eos=True), "sample"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_target(models, case):
    params, draft_sampling = CASES[case]
    p12, p23 = p_values(models, params, draft_sampling)
    assert p12 > ALPHA and p23 > ALPHA, (p12, p23)


def _always_accept(draft_token_ids, num_draft, draft_probs, target_probs, generators, default_generator):
    """A broken rule: every draft is accepted, the bonus drawn from the target."""
    rows = torch.arange(draft_token_ids.shape[0])
    bonus = torch.multinomial(target_probs[rows, num_draft], 1, generator=default_generator)[:, 0]
    tokens = torch.cat([draft_token_ids, torch.full_like(bonus[:, None], -1)], dim=1)
    tokens[rows, num_draft] = bonus
    return AcceptResult(token_ids=tokens, num_emitted=num_draft + 1, num_accepted=num_draft.clone())


def test_broken_acceptance_rule_is_detected(models, monkeypatch):
    monkeypatch.setattr(engine_module, "accept_drafts", _always_accept)
    params, draft_sampling = CASES["t1-sampled-draft"]
    p12, p23 = p_values(models, params, draft_sampling)
    assert min(p12, p23) < 1e-9, (p12, p23)
