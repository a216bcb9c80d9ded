"""Greedy `LLM.generate` equals transformers' `generate(do_sample=False)` token for token (float32,
page_size 4, tiny Llama / Qwen2 / tied models), through batching, chunked prefill, requests joining
mid-flight, and the stop conditions (max_tokens, EOS, stop_token_ids, ignore_eos). Where sequences
part, `assert_greedy_match` demands a proven near-tie."""

from __future__ import annotations

import functools

import pytest
import torch
from greedy_compare import assert_greedy_match, engine_logits_fn, first_difference, step_logits_fn
from testkit import tiny_hf_model, tiny_llm
from transformers import GenerationConfig

from speculant.sampling.params import SamplingParams

EOS = 2  # tiny_hf_config's eos_token_id
PROMPT_LENGTHS = (1, 3, 6, 9, 14, 21)
MAX_TOKENS = 20


def _prompts(lengths=PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, 256, (n - 1,), generator=gen).tolist() for n in lengths]


@functools.cache
def _hf(kind: str, eos: int | None = EOS):
    return tiny_hf_model(kind, eos_token_id=eos)


@functools.cache
def _reference(kind: str, prompt: tuple[int, ...], max_tokens: int, eos: int | None = EOS):
    """transformers' greedy tokens (through the first EOS, if `eos`) and the logits behind them."""
    hf = _hf(kind)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_tokens,
        eos_token_id=eos,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out.sequences[0, len(prompt) :].tolist(), out.logits


def _check(
    llm, kind: str, prompt: list[int], ours: list[int], max_tokens: int, eos: int | None = EOS
) -> None:
    ref, logits = _reference(kind, tuple(prompt), max_tokens, eos)
    assert_greedy_match(ours, ref, step_logits_fn(logits), engine_logits_fn(llm.engine, prompt))


def greedy(max_tokens: int = MAX_TOKENS, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def test_batch_of_prompts_matches_transformers(tiny_kind: str) -> None:
    llm = tiny_llm(_hf(tiny_kind))
    prompts = _prompts()
    outs = llm.generate(prompts, greedy())
    for prompt, out in zip(prompts, outs, strict=True):
        _check(llm, tiny_kind, prompt, out.token_ids, MAX_TOKENS)
        assert out.finish_reason == ("stop" if out.token_ids[-1] == EOS else "length")
    assert llm.engine.pages.allocator.num_used == 0


def test_chunked_prefill_matches_transformers(tiny_kind: str) -> None:
    llm = tiny_llm(_hf(tiny_kind), max_num_batched_tokens=8)
    prompts = _prompts((21, 14, 9, 3), seed=1)
    budgets = _record_step_tokens(llm.engine)
    outs = llm.generate(prompts, greedy())
    for prompt, out in zip(prompts, outs, strict=True):
        _check(llm, tiny_kind, prompt, out.token_ids, MAX_TOKENS)
    assert max(budgets) <= 8 and max(budgets) == 8


def _record_step_tokens(engine, kinds: list[set[bool]] | None = None) -> list[int]:
    """Tokens each step schedules (and, into `kinds`, which of its sequences are prefills),
    recorded by wrapping the scheduler."""
    seen: list[int] = []
    schedule = engine.scheduler.schedule

    def recording():
        batch = schedule()
        seen.append(sum(s.num_new_tokens for s in batch.seqs))
        if kinds is not None:
            kinds.append({s.request.is_prefill for s in batch.seqs})
        return batch

    engine.scheduler.schedule = recording
    return seen


def test_requests_joining_mid_flight(tiny_kind: str) -> None:
    """Prefills share steps with decodes (and chunks with both) as requests arrive between steps."""
    llm = tiny_llm(_hf(tiny_kind), max_num_batched_tokens=10)
    engine = llm.engine
    prompts = _prompts((14, 5, 21, 2, 9, 6), seed=2)
    arrivals = {0: [0, 1], 2: [2], 3: [3], 7: [4, 5]}  # step -> prompts added before it
    kinds: list[set[bool]] = []
    budgets = _record_step_tokens(engine, kinds)
    requests, outputs = {}, {}
    for step in range(400):
        for i in arrivals.get(step, []):
            requests[i] = engine.add_request(prompts[i], greedy(), request_id=f"p{i}")
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        if len(outputs) == len(prompts):
            break
    assert {True, False} in kinds, "no step mixed prefill and decode"
    assert max(budgets) <= 10
    for i, prompt in enumerate(prompts):
        _check(llm, tiny_kind, prompt, outputs[f"p{i}"], MAX_TOKENS)
    assert engine.pages.allocator.num_used == 0 and not engine.has_unfinished()


def test_max_tokens_per_request() -> None:
    kind = "llama"
    llm = tiny_llm(_hf(kind))
    prompts = _prompts((5, 5, 8, 2))
    prompts[1] = prompts[0]
    limits = [1, 7, 3, MAX_TOKENS]
    outs = llm.generate(prompts, [greedy(n, ignore_eos=True) for n in limits])
    for prompt, n, out in zip(prompts, limits, outs, strict=True):
        assert len(out.token_ids) == n and out.finish_reason == "length"
        _check(llm, kind, prompt, out.token_ids, n, eos=None)


def _eos_candidates(kind: str, prompt: list[int]) -> tuple[list[int], int]:
    """The EOS-free greedy run, and a token it emits at position >= 3 not seen before that."""
    ref, _ = _reference(kind, tuple(prompt), MAX_TOKENS, None)
    for i in range(3, len(ref)):
        if ref[i] not in ref[:i]:
            return ref, ref[i]
    pytest.skip("greedy run repeats its first tokens; no stop token to pick")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_eos_stop_token_ids_and_ignore_eos(kind: str) -> None:
    prompt = _prompts((6,), seed=5)[0]
    ref, stop = _eos_candidates(kind, prompt)
    cut = ref[: ref.index(stop) + 1]

    with_eos = tiny_llm(tiny_hf_model(kind, eos_token_id=stop))  # the same weights, another EOS
    out = with_eos.generate(prompt, greedy())[0]
    assert (out.token_ids, out.finish_reason) == (cut, "stop")
    out = with_eos.generate(prompt, greedy(ignore_eos=True))[0]
    assert (out.token_ids, out.finish_reason) == (ref, "length")
    out = with_eos.generate(prompt, greedy(ignore_eos=True, stop_token_ids=[stop]))[0]
    assert (out.token_ids, out.finish_reason) == (cut, "stop"), (
        "explicit stop ids outlive ignore_eos"
    )

    plain = tiny_llm(_hf(kind))
    out = plain.generate(prompt, greedy(stop_token_ids=[stop], ignore_eos=True))[0]
    assert (out.token_ids, out.finish_reason) == (cut, "stop")


def test_context_limit_finishes_with_length() -> None:
    """A prompt near max_position (512) stops when the sequence fills the context."""
    llm = tiny_llm(_hf("llama"), max_num_batched_tokens=512)
    prompt = _prompts((505,), seed=6)[0]
    out = llm.generate(prompt, greedy(50, ignore_eos=True))[0]
    assert len(out.token_ids) == 512 - 505 and out.finish_reason == "length"
    _check(llm, "llama", prompt, out.token_ids, 512 - 505, eos=None)


# ---- the comparison helper itself -----------------------------------------------------------


def _logits(top: dict[int, float], vocab: int = 8) -> torch.Tensor:
    logits = torch.full((vocab,), -5.0)
    for token, value in top.items():
        logits[token] = value
    return logits


def test_helper_accepts_equal_and_near_tie() -> None:
    fail = lambda prefix: pytest.fail("logits needed only where sequences part")  # noqa: E731
    assert assert_greedy_match([1, 2, 3], [1, 2, 3], fail, fail) is None
    tie = lambda prefix: _logits({4: 1.0, 5: 1.0 - 2e-4})  # noqa: E731
    assert assert_greedy_match([1, 4, 0], [1, 5, 6], tie, tie) == 1


@pytest.mark.parametrize(
    "ref_top, ours_top",
    [
        ({4: 1.0, 5: 0.9}, {4: 1.0, 5: 1.0}),  # reference gap too large
        ({4: 1.0, 5: 1.0}, {4: 1.0, 6: 1.0, 5: 0.99}),  # ours: the reference token is not top-2
    ],
)
def test_helper_rejects_non_ties(ref_top, ours_top) -> None:
    with pytest.raises(AssertionError, match="not a tie"):
        assert_greedy_match([1, 4], [1, 5], lambda p: _logits(ref_top), lambda p: _logits(ours_top))


def test_helper_rejects_early_stop() -> None:
    assert first_difference([1, 2], [1, 2, 3]) == 2
    with pytest.raises(AssertionError, match="stops where the other goes on"):
        assert_greedy_match([1, 2], [1, 2, 3], lambda p: _logits({}), lambda p: _logits({}))
