"""Tensor parallelism on CPU with gloo: two ranks give the same greedy tokens as one for plain
decoding and every proposer; each rank holds half of the target's sharded weights and its
KV heads; a draft LLM lives on the leader only; a worker that dies or hangs fails the leader
with a clear error instead of a hang."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from testkit import (
    MIXED_PROMPTS,
    TinyCheckpoint,
    fit_head,
    greedy_params,
    noisy_copy,
    tiny_hf_model,
    tiny_llm,
)

from speculant.distributed.sharding import Shard, slice_of
from speculant.executor.errors import ExecutorFailed
from speculant.executor.plan import TARGET

PROMPTS = MIXED_PROMPTS
GREEDY = greedy_params()
HANG_BOUND_S = 120  # far above any timeout here: a failure must come, not hang


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def plain_outputs(target):
    return [o.token_ids for o in tiny_llm(target).generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def head(target, plain_outputs):
    return fit_head(target, [p + o for p, o in zip(PROMPTS[::2], plain_outputs[::2])], steps=150)


@contextlib.contextmanager
def two_ranks(target, draft=None, **options):
    llm = tiny_llm(target, draft, tensor_parallel_size=2, **options)
    try:
        yield llm
    finally:
        llm.close()


def generate(llm) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_plain_greedy_equals_one_rank_and_each_rank_holds_half(target, plain_outputs):
    one = tiny_llm(target).engine.executor.runner(TARGET)
    with two_ranks(target, max_num_batched_tokens=8) as llm:  # prefills in chunks too
        assert generate(llm) == plain_outputs
        ranks = llm.engine.executor.holdings()
    ckpt = TinyCheckpoint(target)
    sharded = sum(w.numel() for name, w in ckpt.weights.items() if slice_of(name, ckpt.arch, Shard(0, 2)) is not None)
    assert [r[TARGET]["sharded_elements"] for r in ranks] == [sharded // 2, sharded // 2]
    assert [r[TARGET]["kv_bytes"] for r in ranks] == [one.kv.k.nbytes, one.kv.k.nbytes]  # half the heads: (k + v) / 2


def test_one_broadcast_per_forward(target, monkeypatch):
    """A plain decode step is one target forward: the leader broadcasts one message for it."""
    with two_ranks(target) as llm:
        engine = llm.engine
        for prompt in PROMPTS[:4]:
            engine.add_request(prompt, GREEDY)
        engine.step()  # the prefill
        group = engine.executor.channel.group
        sent = []
        monkeypatch.setattr(group, "broadcast", lambda buf, real=group.broadcast: (sent.append(buf.numel()), real(buf)))
        for _ in range(3):
            engine.step()
        assert len(sent) == 3


@pytest.mark.parametrize("speculative", ["none", "draft"])
def test_overlapped_steps_equal_one_rank(target, plain_outputs, speculative):
    """With step overlap the forwards run on the engine's step thread: still one at a time."""
    draft = noisy_copy(target) if speculative == "draft" else None
    with two_ranks(target, draft, overlap=True, **({"num_draft_tokens": 3} if draft is not None else {})) as llm:
        assert generate(llm) == plain_outputs


def test_ngram_greedy_equals_one_rank(target, plain_outputs):
    with two_ranks(target, speculative="ngram", num_draft_tokens=3) as llm:
        assert generate(llm) == plain_outputs
        assert llm.stats()["draft_tokens"] > 0


def test_draft_model_lives_on_the_leader_only(target, plain_outputs):
    with two_ranks(target, noisy_copy(target), num_draft_tokens=3) as llm:
        assert generate(llm) == plain_outputs
        stats = llm.stats()
        leader, worker = llm.engine.executor.holdings()
    assert 0 < stats["accepted_tokens"] < stats["draft_tokens"]
    assert leader["draft"]["weight_bytes"] > 0 and leader["draft"]["kv_bytes"] > 0
    assert "draft" not in worker and set(worker) == {TARGET}


def test_mtp_head_sharded_like_the_target(target, head, plain_outputs):
    with two_ranks(target, speculative="mtp", draft_checkpoint=head, num_draft_tokens=3) as llm:
        assert generate(llm) == plain_outputs
        assert llm.stats()["accepted_tokens"] > 0
        leader, worker = llm.engine.executor.holdings()
    assert set(leader) == set(worker) == {TARGET, "head"}
    assert leader["head"]["kv_bytes"] == worker["head"]["kv_bytes"] > 0


@pytest.mark.parametrize("shape", ["dynamic", "static"])
def test_eagle_tree_greedy_equals_one_rank(target, head, plain_outputs, shape):
    with two_ranks(target, speculative="eagle", draft_checkpoint=head, num_draft_tokens=6, tree=shape, tree_depth=3, tree_topk=2) as llm:
        assert generate(llm) == plain_outputs
        assert llm.stats()["accepted_tokens"] > 0


def _worker_pid(llm) -> int:
    return llm.engine.executor.workers.processes[0].pid


def _step_until_failure(engine) -> ExecutorFailed:
    deadline = time.monotonic() + HANG_BOUND_S
    while time.monotonic() < deadline:
        try:
            engine.step()
        except ExecutorFailed as exc:
            return exc
    raise AssertionError("the engine kept running without its worker")


def test_close_stops_every_rank_in_order(target):
    """close(): each worker closes its connections after STOP and says so before it exits; the
    leader closes its own only then (gloo may abort a process tearing down its connections while
    a peer closes)."""
    llm = tiny_llm(target, tensor_parallel_size=2)
    llm.generate(PROMPTS[:1], GREEDY)
    workers = llm.engine.executor.workers
    llm.close()
    assert workers.store.check(["stopped/1"])
    assert [p.exitcode for p in workers.processes] == [0]
    with pytest.raises(ExecutorFailed, match="closed"):
        llm.generate(PROMPTS[:1], GREEDY)


def test_a_killed_worker_fails_the_leader_cleanly(target):
    with two_ranks(target, worker_timeout_s=30) as llm:
        engine = llm.engine
        for prompt in PROMPTS:
            engine.add_request(prompt, GREEDY)
        for _ in range(3):
            engine.step()
        os.kill(_worker_pid(llm), signal.SIGKILL)
        error = _step_until_failure(engine)
        assert "rank 1 was killed by SIGKILL" in str(error)
        with pytest.raises(ExecutorFailed):  # and stays failed
            engine.step()


def test_a_hung_worker_fails_the_leader_after_the_timeout(target):
    with two_ranks(target, worker_timeout_s=2) as llm:
        engine = llm.engine
        engine.add_request(PROMPTS[1], GREEDY)
        engine.step()
        os.kill(_worker_pid(llm), signal.SIGSTOP)
        error = _step_until_failure(engine)
        assert "did not answer within 2 s" in str(error)
        assert not llm.engine.executor.workers.processes[0].is_alive()  # stopped for good


def test_an_eagle3_head_is_refused_naming_the_option(target):
    head = fit_head(target, [PROMPTS[0] + [5, 6, 7]], variant="eagle3", steps=1)
    with pytest.raises(ValueError, match=r"tensor_parallel_size > 1 runs no head that reads the target's feature_layers \[1, 1, 0\].*tensor_parallel_size=1"):
        tiny_llm(target, tensor_parallel_size=2, speculative="mtp", draft_checkpoint=head)


def test_unshardable_model_is_refused_before_any_worker_starts(target):
    with pytest.raises(ValueError, match="tensor_parallel_size=4 exceeds the model's 2 KV heads"):
        tiny_llm(target, tensor_parallel_size=4)
