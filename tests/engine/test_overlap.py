"""The overlapped schedule: step N+1's batch is prepared (pages reserved for the most tokens step
N may emit) while step N's forwards run in the worker thread. Outputs equal the serial
schedule's, one host read per decode step still holds, the timeline records every stage and
shows host time hidden behind the forwards, and no page is left behind."""

from __future__ import annotations

import pytest
from testkit import MIXED_PROMPTS, fit_head, greedy_params, noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.utils import sync
from speculant.utils.device_check import device_check

METHODS = {
    "plain": {},
    "ngram": {"speculative": "ngram"},
    "draft": {"speculative": "draft", "num_draft_tokens": 3},
    "mtp": {"speculative": "mtp", "num_draft_tokens": 3, "head_lookup": 2},  # the head's chain and copies
}
SEEDED = SamplingParams(max_tokens=16, temperature=0.8, seed=11, logprobs=True, top_logprobs=2)


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def head(target):
    """A head fitted on the target's greedy continuations of half the prompts (MTP's drafts)."""
    plain = tiny_llm(target).generate(MIXED_PROMPTS[::2], greedy_params())
    return fit_head(target, [p + o.token_ids for p, o in zip(MIXED_PROMPTS[::2], plain)], steps=100)


def llm_for(method: str, target, head=None, **options):
    kwargs = {**METHODS[method], **options}
    if kwargs.get("speculative") == "mtp":
        kwargs["draft_checkpoint"] = head
    draft = noisy_copy(target) if kwargs.get("speculative") == "draft" else None
    return tiny_llm(target, draft, **{"adaptive_k": False, **kwargs})  # the same k's serial and overlapped


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("params", [greedy_params(), SEEDED], ids=["greedy", "seeded"])
def test_overlap_outputs_equal_serial_outputs(method, params, target, head):
    serial = llm_for(method, target, head).generate(MIXED_PROMPTS, params)
    llm = llm_for(method, target, head, overlap=True)
    overlapped = llm.generate(MIXED_PROMPTS, params)
    assert [o.token_ids for o in overlapped] == [o.token_ids for o in serial]
    assert [o.logprobs for o in overlapped] == [o.logprobs for o in serial]
    assert llm.stats()["kv_pages_used"] == 0 and not llm.engine.requests


@pytest.mark.parametrize("method", METHODS)
def test_overlapped_decode_step_reads_once_and_mixes_no_devices(method, target, head):
    llm = llm_for(method, target, head, overlap=True)
    for prompt in MIXED_PROMPTS[:4]:
        llm.engine.add_request(prompt, SEEDED)
    with sync.strict_sync(), device_check():
        while llm.engine.has_unfinished():
            llm.engine.step()
    assert llm.stats()["host_reads_per_step"] == 1.0


def test_timeline_records_the_stages_and_the_hidden_host_time(target):
    serial = llm_for("draft", target)
    serial.generate(MIXED_PROMPTS, greedy_params())
    assert serial.stats()["host_hidden_s"] == 0.0 and serial.stats()["host_stage_s"] > 0
    llm = llm_for("draft", target, overlap=True)
    for prompt in MIXED_PROMPTS:
        llm.engine.add_request(prompt, greedy_params())
    for _ in range(3):
        llm.engine.step()  # prefill, then decode steps
    stages = {(s["stage"], s["worker"]) for s in llm.engine.timeline.last()}
    assert {("schedule", False), ("plan", False), ("prepare", False), ("commit", False)} <= stages
    assert {("propose", True), ("forward:draft", True), ("forward:target", True), ("read", True)} <= stages
    assert llm.stats()["host_hidden_s"] > 0  # the preparation ran while the worker was busy
    assert llm.stats()["host_hidden_s"] <= llm.stats()["host_stage_s"]


def test_prepared_pages_cover_the_most_tokens_a_step_may_emit(target):
    """While a decode step verifies k drafts, the next step's pages are reserved for k + 1 new
    tokens plus the proposer's lookahead, before acceptance is known."""
    llm = llm_for("draft", target, overlap=True)
    engine = llm.engine
    engine.add_request(MIXED_PROMPTS[0], greedy_params())
    engine.step()  # prefill
    request = next(iter(engine.requests.values()))
    before = request.num_tokens
    engine.step()
    lookahead = engine.proposer.lookahead_slots(request)
    need = before + 3 + 1 + lookahead  # k = 3 drafts and the bonus, then the next lookahead
    assert len(engine.pages.table(request.request_id)) == engine.pages.pages_for(need)
