"""processed_probs against a per-row reference, sample reproducibility, token_logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from speculant.sampling.params import SamplingParams
from speculant.sampling.sampler import (
    SamplingTensors,
    argmax_tokens,
    processed_probs,
    sample,
    token_logprobs,
    top_token_logprobs,
)

# Decisions closer than this to a top-p / min-p threshold may differ between float32 and the
# float64 reference; such rows are skipped rather than compared.
_MARGIN = 1e-4


class _Ambiguous(Exception):
    pass


def _check_margin(ok: bool) -> None:
    if not ok:
        raise _Ambiguous


def _reference_row(logits: list[float], params: SamplingParams) -> list[float]:
    """The spec, one row at a time in float64: temperature, top-k, top-p, min-p, renormalize."""
    vocab = len(logits)
    if params.greedy:
        best = max(range(vocab), key=lambda i: (logits[i], -i))
        return [float(i == best) for i in range(vocab)]
    probs = _softmax([x / params.temperature for x in logits])
    order = sorted(range(vocab), key=lambda i: (-probs[i], i))
    keep = set(order[: params.top_k] if params.top_k else order)
    probs = _renormalize([p if i in keep else 0.0 for i, p in enumerate(probs)])
    if params.top_p < 1.0:
        mass, nucleus = 0.0, set()
        for i in order[: len(keep)]:
            _check_margin(abs(mass - params.top_p) > _MARGIN)
            if mass < params.top_p:
                nucleus.add(i)
            mass += probs[i]
        probs = _renormalize([p if i in nucleus else 0.0 for i, p in enumerate(probs)])
    threshold = params.min_p * max(probs)
    if params.min_p > 0:
        _check_margin(all(p == 0 or abs(p - threshold) > _MARGIN * max(probs) for p in probs))
    return _renormalize([p if p >= threshold else 0.0 for p in probs])


def _softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    return _renormalize([math.exp(x - top) for x in xs])


def _renormalize(ps: list[float]) -> list[float]:
    total = sum(ps)
    return [p / total for p in ps]


_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, 0, 1, 2, 3, 5]),
    top_p=st.sampled_from([1.0, 1.0, 0.2, 0.5, 0.8, 0.95]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    vocab=st.integers(2, 9),
    params=st.lists(_params, min_size=1, max_size=6),
)
def test_processed_probs_matches_reference(data, vocab: int, params: list[SamplingParams]) -> None:
    # Logits on a 1/4 grid are exact in float32 and make ties common.
    grid = st.integers(-16, 16).map(lambda i: i / 4)
    rows = [data.draw(st.lists(grid, min_size=vocab, max_size=vocab)) for _ in params]
    try:
        expected = [_reference_row(r, p) for r, p in zip(rows, params, strict=True)]
    except _Ambiguous:
        assume(False)
    got = processed_probs(torch.tensor(rows), SamplingTensors.from_params(params))
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=1e-4
    )


def test_processed_probs_matches_reference_on_a_random_mixed_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    num_rows, vocab = 3000, 12
    logits = (
        torch.randn(num_rows, vocab, generator=gen) * torch.rand(num_rows, 1, generator=gen) * 4
    )

    def pick(options: list) -> list:
        return [
            options[i] for i in torch.randint(len(options), (num_rows,), generator=gen).tolist()
        ]

    params = [
        SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
        for t, k, p, m in zip(
            pick([0.0, 0.5, 1.0, 2.0]),
            pick([0, 1, 3, 6]),
            pick([1.0, 0.3, 0.6, 0.9]),
            pick([0.0, 0.1, 0.5]),
            strict=True,
        )
    ]
    got = processed_probs(logits, SamplingTensors.from_params(params)).double()
    compared = 0
    for row, p in enumerate(params):
        try:
            expected = torch.tensor(_reference_row(logits[row].tolist(), p), dtype=torch.float64)
        except _Ambiguous:
            continue
        torch.testing.assert_close(got[row], expected, atol=1e-5, rtol=1e-4)
        compared += 1
    assert compared > 0.95 * num_rows


def test_neutral_params_give_softmax_on_both_paths() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0)) * 3
    tensors = SamplingTensors.from_params([SamplingParams()] * 5)
    assert not tensors.needs_sort and not tensors.needs_min_p and not tensors.any_greedy
    torch.testing.assert_close(processed_probs(logits, tensors), logits.softmax(-1))
    forced = SamplingTensors.from_params([SamplingParams()] * 5)
    forced.needs_sort = forced.needs_min_p = forced.any_greedy = True
    torch.testing.assert_close(processed_probs(logits, forced), logits.softmax(-1))


def test_greedy_rows_are_one_hot_at_first_argmax() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, top_k=2),
        SamplingParams(),
    ]
    probs = processed_probs(logits, SamplingTensors.from_params(params))
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert probs[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(probs[2], logits[2].softmax(-1))


def test_top_p_always_keeps_top_token() -> None:
    logits = torch.tensor([[3.0, 1.0, 0.0]])
    probs = processed_probs(logits, SamplingTensors.from_params([SamplingParams(top_p=1e-6)]))
    assert probs.tolist() == [[1.0, 0.0, 0.0]]


def test_repeat_interleave_repeats_rows() -> None:
    params = [SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=0.0)]
    tensors = SamplingTensors.from_params(params).repeat_interleave([2, 3])
    assert tensors.temperature.tolist() == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert tensors.top_k.tolist() == [3, 3, 0, 0, 0]
    assert tensors.greedy.tolist() == [False, False, True, True, True]
    assert tensors.needs_sort and len(tensors) == 5


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_seeded_rows_reproduce_whatever_the_batch() -> None:
    probs = torch.randn(6, 100, generator=_seeded(1)).softmax(-1)
    alone = [sample(probs[i : i + 1], [_seeded(7)]).item() for i in range(6)]
    for seeded_row in range(6):
        generators = [None] * 6
        generators[seeded_row] = _seeded(7)
        tokens = sample(probs, generators, default_generator=_seeded(99 + seeded_row))
        assert tokens[seeded_row].item() == alone[seeded_row]
    sequence = [sample(probs[:1], [g]).item() for g in [_seeded(3)] for _ in range(4)]
    again = [sample(probs[:1], [g]).item() for g in [_seeded(3)] for _ in range(4)]
    assert sequence == again


def test_sample_greedy_and_truncated_rows() -> None:
    logits = torch.randn(4, 30, generator=_seeded(2))
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=2)] * 2
    probs = processed_probs(logits, SamplingTensors.from_params(params)).repeat(500, 1)
    tokens = sample(probs, default_generator=_seeded(4)).view(500, 4)
    assert (tokens[:, 0] == logits[0].argmax()).all()
    assert set(tokens[:, 1].tolist()) == set(logits[1].topk(2).indices.tolist())


def test_sample_frequencies_match_probs() -> None:
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0, 0.125]).repeat(40_000, 1)
    tokens = sample(probs, default_generator=_seeded(5))
    freq = torch.bincount(tokens, minlength=5).double() / 40_000
    assert freq[3] == 0
    torch.testing.assert_close(freq, probs[0].double(), atol=0.01, rtol=0)


def test_token_logprobs_is_log_softmax_of_raw_logits() -> None:
    logits = torch.randn(3, 20, generator=_seeded(6), dtype=torch.float64).to(torch.bfloat16)
    ids = torch.tensor([0, 5, 19])
    expected = logits.float().log_softmax(-1)[torch.arange(3), ids]
    got = token_logprobs(logits, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("vocab", [20, 49152, 50001])
def test_logprobs_of_a_row_do_not_depend_on_the_other_rows(vocab) -> None:
    """A decode step reads one row, a verify step several: the same row's logprobs must agree
    bit for bit (torch's own logsumexp splits a lone row over threads and can differ by an ulp),
    also off the main thread, where the server's engine runs."""
    import threading

    def check() -> None:
        gen = _seeded(0)
        for _ in range(100):
            rows = torch.randn(4, vocab, generator=gen) * 3
            ids = torch.zeros(4, dtype=torch.int64)
            assert torch.equal(token_logprobs(rows, ids)[:1], token_logprobs(rows[:1].clone(), ids[:1]))
            assert torch.equal(top_token_logprobs(rows, 3)[0][:1], top_token_logprobs(rows[:1].clone(), 3)[0])

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check()
        errors = []
        worker = threading.Thread(target=lambda: _record_error(check, errors))
        worker.start()
        worker.join()
        assert not errors, errors

    finally:
        torch.set_num_threads(threads)


def test_logprobs_of_a_row_of_minus_infinity_but_one() -> None:
    logits = torch.full((2, 10), -torch.inf)
    logits[0, 3] = 1.0
    logits[1, 0] = -5.0
    assert token_logprobs(logits, torch.tensor([3, 0])).tolist() == [0.0, 0.0]


def _record_error(fn, errors: list) -> None:
    try:
        fn()
    except AssertionError as exc:
        errors.append(exc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_tokens_is_torch_argmax_for_any_shape_and_layout(dtype):
    torch.manual_seed(5)
    logits = torch.randn(3, 4, 301).to(dtype)
    for x in (logits, logits[0, 0], logits.transpose(0, 1), logits[..., ::2]):  # 3-D, 1-D, strided
        assert torch.equal(argmax_tokens(x), x.argmax(-1))
