"""EAGLE tree speculation: lossless greedy output for static and dynamic trees at any batch,
a head that knows the continuation gets every path accepted, the accepted path's K/V (target and
head) equals a fresh prefill, and tree options are checked."""

from __future__ import annotations

import pytest
import torch
from testkit import (
    MIXED_PROMPTS,
    fit_head,
    greedy_params,
    strict_decode_step,
    tiny_hf_model,
    tiny_llm,
)

from speculant import SamplingParams
from speculant.executor.plan import TARGET

GREEDY = greedy_params()
PROMPTS = MIXED_PROMPTS
TREES = {"static": dict(tree="static", tree_depth=4, tree_topk=3, num_draft_tokens=10),
         "dynamic": dict(tree="dynamic", tree_depth=4, tree_topk=3, num_draft_tokens=10)}


def eagle_llm(target, head, **options):
    return tiny_llm(target, speculative="eagle", draft_checkpoint=head, **options)


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_tree_greedy_equals_plain(target, head, plain_outputs, shape, batch_size):
    llm = eagle_llm(target, head, **TREES[shape])
    assert [o.token_ids for o in llm.generate(PROMPTS[:batch_size], GREEDY)] == plain_outputs[:batch_size]
    stats = llm.stats()
    assert stats["accepted_tokens"] > 0 and stats["tau"] > 1.5
    assert stats["kv_pages_used"] == 0


def test_tree_of_one_chain_is_the_mtp_chain(target, head):
    """topk = 1: the tree is MTP's chain of the same depth (the head alone), with the same acceptance."""
    mtp = tiny_llm(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=4, adaptive_k=False, head_lookup=0)
    mtp.generate(PROMPTS[:2], GREEDY)
    for shape in TREES:
        llm = eagle_llm(target, head, tree=shape, tree_depth=4, tree_topk=1, num_draft_tokens=4)
        llm.generate(PROMPTS[:2], GREEDY)
        assert llm.stats()["acceptance_by_position"] == mtp.stats()["acceptance_by_position"]


def test_tree_with_chunked_prefill_preemption_and_context_end(target, head, plain_outputs):
    llm = eagle_llm(target, head, **TREES["dynamic"], max_num_batched_tokens=8, num_pages=60)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    near_end = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    short = tiny_hf_model("llama", max_position_embeddings=48)
    expected = tiny_llm(short).generate([PROMPTS[1]], near_end)[0].token_ids
    got = eagle_llm(short, fit_head(short, [PROMPTS[1]], steps=20), **TREES["static"]).generate([PROMPTS[1]], near_end)[0]
    assert got.token_ids == expected  # trees stop where they no longer fit; plain steps finish


def test_a_head_that_knows_the_continuation_gets_every_path_accepted(target):
    """A head overfit on the target's own greedy continuation drafts it at both levels of a
    static tree: every step accepts the full depth (τ = 3)."""
    prompt = [11, 12, 13]
    params = SamplingParams(max_tokens=31, temperature=0, ignore_eos=True)
    out = tiny_llm(target).generate([prompt], params)[0]
    head = fit_head(target, [prompt + out.token_ids], steps=300)
    llm = eagle_llm(target, head, tree="static", tree_depth=2, tree_topk=2, num_draft_tokens=6)
    assert llm.generate([prompt], params)[0].token_ids == out.token_ids
    stats = llm.stats()
    assert stats["acceptance_rate"] == 1.0 and stats["tau"] == 3.0


@pytest.mark.parametrize("shape", list(TREES))
def test_accepted_kv_equals_a_fresh_prefill(target, head, shape):
    """After tree steps, the target's and the head's K/V over the sequence are those of a fresh
    prefill of its tokens (the accepted path moved into contiguous slots)."""
    llm = eagle_llm(target, head, **TREES[shape])
    engine = llm.engine
    request = engine.add_request(PROMPTS[0], GREEDY)  # a prompt the head was fitted on
    for _ in range(4):
        engine.step()
    assert engine.stats.spec_stats.accepted_tokens > 3
    fresh = eagle_llm(target, head, **TREES[shape]).engine
    again = fresh.add_request(request.all_token_ids[:-1], GREEDY)
    fresh.step()
    assert again.output_token_ids == [request.all_token_ids[-1]]
    length = request.num_computed_tokens
    assert length == again.num_computed_tokens == request.num_tokens - 1
    for model in (TARGET, "head"):
        mine, theirs = _kv(engine, model, request, length), _kv(fresh, model, again, length)
        assert torch.allclose(mine, theirs, atol=1e-5), model


def _kv(engine, model: str, request, length: int) -> torch.Tensor:  # [2, layers, length, kv_heads, head_dim]
    kv = engine.executor.runner(model).kv
    slots = torch.tensor(kv.slots(engine.pages.table(request.request_id), length))
    return torch.stack([kv.k[:, slots], kv.v[:, slots]])


def test_tree_options_are_checked(target, head):
    with pytest.raises(ValueError, match="tree must be one of"):
        eagle_llm(target, head, tree="bushy")
    with pytest.raises(ValueError, match="needs tree='static'"):
        eagle_llm(target, head, tree="dynamic", head_sampling="sample")
    with pytest.raises(ValueError, match="tree_depth"):
        eagle_llm(target, head, tree_depth=0)


def test_auto_budget_is_measured_and_reported(target, head, plain_outputs):
    llm = eagle_llm(target, head, **{**TREES["dynamic"], "num_draft_tokens": 12}, tree_auto_budget=True)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    stats = llm.stats()
    assert 0 <= stats["tree_budget"] <= stats["tree_budget_max"] == 12  # 0: a plain step pays best
    assert sorted(stats["verify_cost_s"]) == [1, 2, 4, 8, 13]
    assert stats["kv_pages_used"] == 0  # the calibration's scratch pages went back


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_a_small_dynamic_budget_grows_no_deeper_than_it_keeps(target, head, plain_outputs, budget):
    """b kept nodes are at most b deep, so a step grows at most b - 1 head levels (the tree depth
    allows 3)."""
    llm = eagle_llm(target, head, **{**TREES["dynamic"], "num_draft_tokens": budget})
    proposer, levels = llm.engine.proposer, []
    propose, entries = proposer.propose, proposer._entries

    def recording(batch):
        levels.append(0)
        out = yield from propose(batch)
        assert max(proposer._depths) <= budget
        return out

    def counting(*args):
        levels[-1] += 1
        return (yield from entries(*args))

    proposer.propose, proposer._entries = recording, counting
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], GREEDY)] == plain_outputs[:3]
    assert levels and max(levels) == budget - 1


@pytest.mark.parametrize("auto_budget", [False, True], ids=["fixed", "auto-budget"])
def test_one_host_read_per_decode_step_strict(target, head, auto_budget):
    """A greedy static-tree decode step in strict sync mode under the device-mixing check: one
    host read, the accepted paths (for the tree budget) read with the tokens. (Every method and
    tree shape, sampled and dynamic trees included: tests/engine/test_reads_by_method.py.)"""
    llm = eagle_llm(target, head, tree_auto_budget=auto_budget, **TREES["static"])
    params = [GREEDY, SamplingParams(max_tokens=24, temperature=0, logprobs=True, top_logprobs=2), GREEDY]
    reads, drafted = strict_decode_step(llm, PROMPTS[:3], params)
    assert reads == 1
    assert drafted > 0
