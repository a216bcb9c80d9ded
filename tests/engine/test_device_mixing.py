"""Decode steps of every chain method run clean under the device-mixing check (host tensors
never meet device tensors), with mixed sampling parameters at batch 3; and the check catches a
proposer that hands the engine host-made drafts."""

from __future__ import annotations

import pytest
from testkit import CHAIN_METHODS, noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.speculative import ngram
from speculant.speculative.drafts import pad_proposals
from speculant.utils.device_check import DeviceMixError, device_check

METHODS = CHAIN_METHODS
PARAMS = [
    SamplingParams(max_tokens=8, temperature=0),
    SamplingParams(max_tokens=8, temperature=0.8, seed=7, logprobs=True, top_logprobs=3),
    SamplingParams(max_tokens=8, temperature=0.8, top_k=20, min_p=0.05),
]
PROMPTS = [list(range(3, 60)), list(range(10, 40)) * 2, [5, 6, 7]]


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


def llm_for(method: str, target):
    kwargs = METHODS[method]
    draft = noisy_copy(target) if kwargs.get("speculative") == "draft" else None
    return tiny_llm(target, draft, **kwargs)


@pytest.mark.parametrize("method", METHODS)
def test_every_step_runs_clean_under_the_device_check(method, target):
    llm = llm_for(method, target)
    expected = [o.token_ids for o in llm_for(method, target).generate(PROMPTS, PARAMS[:1] * 3)]
    with device_check():
        outs = llm.generate(PROMPTS, PARAMS)
        greedy = llm.generate(PROMPTS, PARAMS[:1] * 3)
    assert all(o.finish_reason in ("stop", "length") for o in outs)
    assert [o.token_ids for o in greedy] == expected  # the check changes nothing


def test_host_made_drafts_are_caught(target, monkeypatch):
    monkeypatch.setattr(ngram, "pad_proposals", lambda drafts, device: pad_proposals(drafts))  # left on the host
    llm = llm_for("ngram", target)
    with device_check(), pytest.raises(DeviceMixError, match="mixes host tensors"):
        llm.generate(PROMPTS, PARAMS[:1] * 3)
