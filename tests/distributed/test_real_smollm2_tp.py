"""The real smollm2-135m over two ranks: 9 query heads over 3 KV heads split 6 + 3 (2 + 1 KV
heads), each rank reading only its slices from the safetensors folder. Logits and greedy
tokens equal one rank's (sequences may part only at a proven near-tie: the row-parallel sums
add in another order), and the shipped MTP head, sharded like the target, stays lossless."""

from __future__ import annotations

import sys

import pytest
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "engine"))
from greedy_compare import assert_greedy_match, engine_logits_fn  # noqa: E402

from speculant import LLM, SamplingParams  # noqa: E402

pytestmark = pytest.mark.real_model

TIE_GAP = 1e-2
PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn rain.", "Explain recursion to a child."]
OPTIONS = dict(weights="fp32", speculative="none", page_size=4, max_num_batched_tokens=2048)


@pytest.fixture(scope="module")
def engines():
    one = LLM(model="smollm2-135m", **OPTIONS)
    two = LLM(model="smollm2-135m", tensor_parallel_size=2, **OPTIONS)
    prompts = [one.apply_chat_template([{"role": "user", "content": p}]) for p in QUESTIONS]
    yield one, two, prompts
    two.close()


def test_logits_and_greedy_tokens_equal_one_rank(engines):
    one, two, prompts = engines
    torch.testing.assert_close(engine_logits_fn(two.engine, prompts[0])([]), engine_logits_fn(one.engine, prompts[0])([]), atol=1e-3, rtol=0)
    parted = 0
    for prompt, a, b in zip(prompts, one.generate(prompts, PARAMS), two.generate(prompts, PARAMS)):
        where = assert_greedy_match(b.token_ids, a.token_ids, engine_logits_fn(one.engine, prompt), engine_logits_fn(two.engine, prompt), gap=TIE_GAP)
        parted += where is not None
    assert parted <= 1


def test_shipped_mtp_head_over_two_ranks_is_lossless(engines):
    _, two, prompts = engines
    plain = [o.token_ids for o in two.generate(prompts, PARAMS)]
    mtp = LLM(model="smollm2-135m", **{**OPTIONS, "speculative": "mtp"}, num_draft_tokens=3, adaptive_k=False, tensor_parallel_size=2)
    try:
        assert [o.token_ids for o in mtp.generate(prompts, PARAMS)] == plain
        assert mtp.stats()["accepted_tokens"] > 0
        leader, worker = mtp.engine.executor.holdings()
        assert set(worker) == {"target", "head"}
    finally:
        mtp.close()


def test_torchrun_ranks_generate_what_one_rank_does(engines):
    """`torchrun --nproc-per-node 2 -m speculant.cli generate`: rank 0 leads, rank 1 serves it
    (rendezvous at torchrun's MASTER_ADDR / MASTER_PORT); both exit 0."""
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prompt = "The capital of France is"
    (one,) = engines[0].generate([prompt], SamplingParams(max_tokens=8, temperature=0))
    args = ["generate", "--model", "smollm2-135m", "--prompt", prompt, "--max-tokens", "8", "--temperature", "0", "--tensor-parallel-size", "2",
            "--weights", "fp32", "--speculative", "none"]
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port), "-m", "speculant.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    two = subprocess.run([*run, *args], capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-8000:]  # the ranks' own lines come before the launcher's report
    assert two.stdout.strip() == one.text.strip() != ""
