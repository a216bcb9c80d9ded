"""The real smollm2-135m checkpoint: our greedy tokens and logits equal transformers' (fp32).

The transformers reference runs transformers' own Llama modeling code on the checkpoint's weights
(the loader tests prove those weights equal transformers' own GGUF loading, tensor for tensor).
Logits must agree to LOGIT_ATOL; greedy sequences may part only at a proven near-tie
(both tokens the other side's top-2 with a gap below TIE_GAP).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from greedy_compare import assert_greedy_match, engine_logits_fn, step_logits_fn

from speculant import LLM, SamplingParams
from speculant.bench.common import hf_twin, load_prompts

pytestmark = pytest.mark.real_model

LOGIT_ATOL = 2e-3  # fp32 logits of magnitude ~10-30; summation order differs from transformers'
TIE_GAP = 1e-2
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def setup():
    from speculant.loader import load_checkpoint

    checkpoint = load_checkpoint("smollm2-135m")
    hf = hf_twin(checkpoint)
    llm = LLM(model="smollm2-135m", checkpoint=checkpoint, weights="fp32", speculative="none", page_size=4, max_num_batched_tokens=2048)
    prompts = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in _chat_prompts(6)]
    prompts.append(llm.tokenizer.encode("The capital of France is"))
    return llm, hf, prompts


def _chat_prompts(n: int) -> list[str]:
    """MT-bench's first turns; without the shared data beside the checkout, the project's own chat prompts."""
    try:
        return load_prompts("mt_bench", n)
    except FileNotFoundError:
        path = pathlib.Path(__file__).resolve().parents[2] / "data" / "prompts" / "categories.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [r["prompt"] for r in rows if r["category"] == "chat"][:n]


def test_prompt_logits_match_transformers(setup):
    llm, hf, prompts = setup
    for prompt in prompts[:3]:
        ours = engine_logits_fn(llm.engine, prompt)([])
        with torch.no_grad():
            theirs = hf(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(ours, theirs, atol=LOGIT_ATOL, rtol=0)


def test_batched_greedy_equals_transformers(setup):
    llm, hf, prompts = setup
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    parted = 0
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                pad_token_id=0, output_logits=True, return_dict_in_generate=True,
            )
        ref_tokens = ref.sequences[0, len(prompt):].tolist()
        where = assert_greedy_match(
            out.token_ids, ref_tokens, step_logits_fn(ref.logits), engine_logits_fn(llm.engine, prompt), gap=TIE_GAP
        )
        parted += where is not None
    assert parted <= 1, "more than one near-tie in a handful of prompts is suspicious"


def test_chat_answer_is_coherent(setup):
    llm, _, _ = setup
    (out,) = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(max_tokens=24, temperature=0))
    assert "Paris" in out.text


def test_shipped_mtp_head_is_found_and_lossless(setup):
    """`speculative="mtp"` finds the head shipped for smollm2-135m; its greedy output equals
    plain greedy output on real chat prompts (batched), with drafts accepted."""
    llm, _, prompts = setup
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    plain = [o.token_ids for o in llm.generate(prompts, params)]
    mtp = LLM(model="smollm2-135m", weights="fp32", speculative="mtp", num_draft_tokens=3, adaptive_k=False, page_size=4, max_num_batched_tokens=2048)
    assert [o.token_ids for o in mtp.generate(prompts, params)] == plain
    assert mtp.stats()["accepted_tokens"] > 0


def test_the_default_weight_mode_keeps_the_answer():
    """weights="auto" (the Q4_1 blocks on the native kernels, activations in int16 blocks) answers
    as fp32 does; int8 activation blocks lost this answer to the model's outlier channels."""
    llm = LLM(model="smollm2-135m", weights="auto", speculative="none", kv_cache_bytes=64 << 20)
    (out,) = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(max_tokens=24, temperature=0))
    assert "Paris" in out.text
