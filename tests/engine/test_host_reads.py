"""One host read per decode step: the step's emitted tokens, counts and logprobs are read once,
for plain decoding, n-gram and draft-target speculation (greedy and sampled drafts), at batch 1
and 8, with and without seeds and logprobs. Counted in strict sync mode, where any other read
raises: a read added to the step fails these tests."""

from __future__ import annotations

import pytest
from testkit import noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.utils import sync

METHODS = {
    "plain": {},
    "ngram": {"speculative": "ngram"},
    "draft-greedy": {"speculative": "draft", "num_draft_tokens": 3},
    "draft-sampled": {"speculative": "draft", "num_draft_tokens": 3, "draft_sampling": "sample"},
}
PARAMS = {
    "greedy": SamplingParams(max_tokens=6, temperature=0),
    "seeded-logprobs": SamplingParams(max_tokens=6, temperature=0.8, seed=7, logprobs=True, top_logprobs=3),
    "sampled": SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9),
}


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def draft(target):
    return noisy_copy(target)


def llm_for(method: str, target, draft):
    """Fixed k (adaptive k chooses by measured time, so two runs could verify different shapes)."""
    kwargs = dict(METHODS[method], num_pages=1024, adaptive_k=False)
    return tiny_llm(target, draft if kwargs.get("speculative") == "draft" else None, **kwargs)


def prompts(batch: int) -> list[list[int]]:
    """Every token of the tiny vocabulary once (so an n-gram lookup of any sampled token matches)."""
    base = list(range(3, 256))
    return [base[i * 7 :] + base[: i * 7] for i in range(batch)]


def reads_of_one_decode_step(engine) -> int:
    while not all(r.output_token_ids for r in engine.requests.values()):
        engine.step()  # prefill (chunked)
    drafted = engine.stats.spec_stats.draft_steps
    with sync.strict_sync():
        before = sync.host_reads()
        engine.step()
        reads = sync.host_reads() - before
    speculative = engine.config.speculative.enabled
    assert (engine.stats.spec_stats.draft_steps > drafted) == speculative  # the step verified drafts
    return reads


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("params", PARAMS, ids=PARAMS.keys())
def test_one_host_read_per_decode_step_at_batch_1(method, params, target, draft):
    llm = llm_for(method, target, draft)
    llm.engine.add_request(prompts(1)[0], PARAMS[params])
    assert reads_of_one_decode_step(llm.engine) == 1
    assert llm.stats()["host_reads_per_step"] == 1.0


@pytest.mark.parametrize("method", METHODS)
def test_one_host_read_per_decode_step_at_batch_8(method, target, draft):
    llm = llm_for(method, target, draft)
    kinds = list(PARAMS.values())
    for b, prompt in enumerate(prompts(8)):
        llm.engine.add_request(prompt, kinds[b % len(kinds)])
    assert reads_of_one_decode_step(llm.engine) == 1


def test_strict_mode_catches_a_hidden_read_in_a_proposer(target, draft, monkeypatch):
    llm = llm_for("draft-greedy", target, draft)
    proposer = llm.engine.proposer
    choose = proposer._choose

    def choose_and_peek(*args):
        tokens = choose(*args)
        tokens.max().item()  # a sync an accelerator would pay for
        return tokens

    monkeypatch.setattr(proposer, "_choose", choose_and_peek)
    llm.engine.add_request(prompts(1)[0], PARAMS["greedy"])
    with pytest.raises(sync.HostReadError, match=r"\.item\(\)"):
        reads_of_one_decode_step(llm.engine)


def test_strict_outputs_equal_plain_outputs(target, draft):
    """Strict mode changes nothing but the checks: the same tokens and logprobs."""
    params = PARAMS["seeded-logprobs"]
    expected = llm_for("draft-sampled", target, draft).generate(prompts(2), params)
    with sync.strict_sync():
        llm = llm_for("draft-sampled", target, draft)
        got = llm.generate(prompts(2), params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [o.logprobs for o in got] == [o.logprobs for o in expected]
    assert llm.stats()["host_reads_per_step"] == 1.0
