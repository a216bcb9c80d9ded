"""The real gemma3-270m (Gemma 3 270M, Q4_K_M GGUF): greedy tokens equal transformers' on the
checkpoint's dequantized weights (fp32), and llama.cpp's on the same file with weights="auto"
(llama-cpp-python, an optional install: skipped without it). Sequences may part only at a near-tie;
the margins of any parting are printed (`pytest -s`)."""

from __future__ import annotations

import pytest
import torch
from greedy_compare import assert_greedy_match, engine_logits_fn, step_logits_fn

from speculant import LLM, SamplingParams
from speculant.bench.common import hf_twin

pytestmark = pytest.mark.real_model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", "The three primary colors are"]
NEW_TOKENS = 32
TIE_GAP = 1e-2
LLAMA_CPP_TIE = 0.25  # logits: both quantize activations for the Q4_K/Q5_0 products, each its own way
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint():
    from speculant.loader import load_checkpoint

    return load_checkpoint("gemma3-270m")


def test_what_the_file_says(checkpoint):
    arch = checkpoint.arch
    assert (arch.family, arch.num_layers, arch.head_dim, arch.sliding_window) == ("gemma3", 18, 256, 512)
    assert arch.sliding_layers == tuple(i for i in range(18) if i % 6 != 5)
    assert arch.stop_token_ids == {1, 106}  # <eos>, and <end_of_turn> by its text
    assert checkpoint.tokenizer.convert_ids_to_tokens(106) == "<end_of_turn>"
    assert checkpoint.tokenizer.encode("Hello")[0] == arch.bos_token_id == 2


def _prompts(llm: LLM) -> list[list[int]]:
    return [llm.tokenizer.encode(p) for p in PROMPTS]


def test_greedy_equals_transformers(checkpoint):
    llm = LLM(model="gemma3-270m", checkpoint=checkpoint, weights="fp32", speculative="none", page_size=16)
    hf = hf_twin(checkpoint)
    for prompt, out in zip(_prompts(llm), llm.generate(_prompts(llm), GREEDY), strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)  # fmt: skip
        where = assert_greedy_match(out.token_ids, ref.sequences[0, len(prompt) :].tolist(), step_logits_fn(ref.logits),
                                    engine_logits_fn(llm.engine, prompt), gap=TIE_GAP)  # fmt: skip
        print(f"transformers: {llm.tokenizer.decode(out.token_ids)!r} parts at {where}")


def test_auto_weights_greedy_equals_llama_cpp(checkpoint):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = LLM(model="gemma3-270m", checkpoint=checkpoint, weights="auto", speculative="none", page_size=16)
    theirs = llama_cpp.Llama(model_path=str(checkpoint.path), n_ctx=512, n_threads=1, logits_all=True, verbose=False)
    for prompt, out in zip(_prompts(llm), llm.generate(_prompts(llm), GREEDY), strict=True):
        ref = _llama_cpp_greedy(theirs, prompt)
        ours = out.token_ids
        parted = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), None)
        print(f"llama.cpp: {llm.tokenizer.decode(ours)!r} parts at {parted}")
        if parted is not None:  # a near-tie for both: each one's margin for its own token is small
            row = theirs.scores[len(prompt) + parted - 1]
            their_gap = float(row[ref[parted]] - row[ours[parted]])
            mine = engine_logits_fn(llm.engine, prompt)(ours[:parted])
            our_gap = float(mine[ours[parted]] - mine[ref[parted]])
            print(f"  margins at the parting: llama.cpp {their_gap:.4f}, ours {our_gap:.4f} (logits)")
            assert max(their_gap, our_gap) < LLAMA_CPP_TIE, f"parted from llama.cpp at token {parted}: margins {their_gap:.3f}, {our_gap:.3f}"


def _llama_cpp_greedy(llm, prompt: list[int]) -> list[int]:
    llm.reset()
    tokens = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        tokens.append(int(token))
        if len(tokens) == NEW_TOKENS:
            break
    return tokens
