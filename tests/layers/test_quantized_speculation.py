"""Speculation stays lossless with quantized weights: its output is the plain output of the
same quantized target (the int4/int8 kernels are row-invariant, so verifying k+1 tokens
computes what k+1 decode steps would)."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch
from testkit import TinyCheckpoint, chi_square_pvalue, tiny_hf_model

from speculant import LLM, SamplingParams
from speculant.config import (
    CacheConfig,
    DraftModelConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from speculant.sampling.sampler import SamplingTensors, processed_probs

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "engine"))
from greedy_compare import engine_logits_fn  # noqa: E402

# Sizes the int4 packer takes (out % 16 == 0, in % 32 == 0).
TINY = dict(hidden_size=64, intermediate_size=128)
PROMPTS = [[5, 9, 12, 5, 9, 12, 5, 9], [3, 4, 5, 6, 3, 4, 5], [7] * 6, [10, 11, 12, 13, 10, 11],
           [20, 21, 20, 21, 20], [30, 31, 32], [40, 41, 42, 40, 41], [50, 51, 50, 51, 50, 51]]


def quantized_llm(weights: str, target, draft=None, method: str = "none", k: int = 4, **cache) -> LLM:
    speculative = SpeculativeConfig(  # fixed k: each k is tested (adaptive k on tiny models may never draft)
        method=method, num_draft_tokens=k, adaptive_k=False, draft=DraftModelConfig(model="tiny-draft" if draft else None)
    )
    config = EngineConfig(
        model=ModelConfig(model="tiny", weights=weights),
        cache=CacheConfig(page_size=4, num_pages=cache.pop("num_pages", 256)),
        scheduler=SchedulerConfig(**cache),
        speculative=speculative,
    )
    draft_checkpoint = TinyCheckpoint(draft) if draft is not None else None
    return LLM(config=config, checkpoint=TinyCheckpoint(target), draft_checkpoint=draft_checkpoint)


@pytest.fixture(scope="module")
def pair():
    target = tiny_hf_model("llama", seed=3, **TINY)
    draft = tiny_hf_model("llama", seed=4, num_hidden_layers=1, **TINY)
    return target, draft


def _tokens(llm: LLM, prompts, max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_greedy_speculation_equals_plain_greedy(pair, weights, method):
    target, draft = pair
    plain = _tokens(quantized_llm(weights, target), PROMPTS)
    for k in (1, 2, 3, 4):
        spec_llm = quantized_llm(weights, target, draft if method == "draft" else None, method, k)
        for batch in (1, 3, 8):
            assert _tokens(spec_llm, PROMPTS[:batch]) == plain[:batch], (k, batch)
        assert spec_llm.stats()["draft_tokens"] > 0


def test_quantized_target_differs_from_the_float_one(pair):
    """The tests above would be hollow if quantization were a no-op."""
    target, _ = pair
    float_logits = engine_logits_fn(quantized_llm("fp32", target).engine, PROMPTS[0])([])
    int4_logits = engine_logits_fn(quantized_llm("int4", target).engine, PROMPTS[0])([])
    assert not torch.equal(float_logits, int4_logits)
    torch.testing.assert_close(int4_logits, float_logits, rtol=0.2, atol=0.2 * float_logits.abs().max().item())


VOCAB, PROMPT, NUM_SAMPLES, ALPHA = 16, [3, 5, 7], 6000, 1e-3


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_speculative_sampling_matches_the_quantized_target(weights):
    """As tests/speculative/test_spec_sampling.py, with the exact law of the first three tokens
    enumerated from the quantized target's own logits."""
    tiny = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, **TINY)
    target = tiny_hf_model("llama", seed=1, **tiny)
    draft = tiny_hf_model("llama", seed=7, num_hidden_layers=1, **tiny)
    params = SamplingParams(max_tokens=3, temperature=1.0, ignore_eos=True)
    llm = quantized_llm(
        weights, target, draft, "draft", k=2, num_pages=4096, max_num_seqs=1024, max_num_batched_tokens=8192
    )
    tokens = torch.tensor([o.token_ids for o in llm.generate([PROMPT] * NUM_SAMPLES, params)])
    assert llm.stats()["draft_tokens"] > 0
    joint12, joint23 = _exact_joints(quantized_llm(weights, target), params)
    p12 = chi_square_pvalue(tokens[:, 0] * VOCAB + tokens[:, 1], joint12)
    p23 = chi_square_pvalue(tokens[:, 1] * VOCAB + tokens[:, 2], joint23)
    assert p12 > ALPHA and p23 > ALPHA, (p12, p23)


def _exact_joints(llm: LLM, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    logits = engine_logits_fn(llm.engine, PROMPT)
    tensors = SamplingTensors.from_params([params])

    def probs(prefix: list[int]) -> torch.Tensor:  # [V]
        return processed_probs(logits(prefix)[None], tensors)[0]

    p1 = probs([])
    p2 = torch.stack([probs([a]) for a in range(VOCAB)])  # [V, V]
    p3 = torch.stack([probs([a, b]) for a in range(VOCAB) for b in range(VOCAB)]).view(VOCAB, VOCAB, VOCAB)
    joint12 = p1[:, None] * p2
    return joint12.reshape(-1), (joint12[:, :, None] * p3).sum(0).reshape(-1)
