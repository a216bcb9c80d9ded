"""accept_drafts: exactness (chi-square against the target), greedy reduction, seeds, edges.

Statistical tests use fixed seeds, so they are deterministic; ALPHA is the significance level
at which the correct rule must pass, and the deliberately broken rules must fail far below it.
"""

from __future__ import annotations

import math

import pytest
import torch
from testkit import chi_square_pvalue

from speculant.sampling.acceptance import accept_drafts, accept_greedy, pad_ragged
from speculant.sampling.params import SamplingParams
from speculant.sampling.rng import PositionNoise, sample_from_weights
from speculant.sampling.sampler import SamplingTensors, processed_probs

ALPHA = 1e-3
VOCAB = 8
NUM_SAMPLES = 60_000


def _dist(gen: torch.Generator, *shape: int) -> torch.Tensor:  # [*shape, VOCAB]
    return (
        (torch.randn(*shape, VOCAB, generator=gen, dtype=torch.float64) * 1.2).softmax(-1).float()
    )


def _draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:  # [n, V] -> [n]
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


class TwoStepChain:
    """A context-dependent target and draft over two positions, and NUM_SAMPLES draft chains.

    Target: y0 ~ p0, y1 ~ P1[y0], bonus ~ p2. Draft: d0 ~ q0, d1 ~ Q1[d0] (or one-hot at them).
    """

    def __init__(self, seed: int, ragged: bool) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.gen = gen
        self.p0, self.P1, self.p2 = _dist(gen), _dist(gen, VOCAB), _dist(gen)
        self.q0, self.Q1 = _dist(gen), _dist(gen, VOCAB)
        n = NUM_SAMPLES
        d0 = _draw(self.q0.expand(n, VOCAB), gen)
        d1 = _draw(self.Q1[d0], gen)
        self.num_draft = torch.randint(0, 3, (n,), generator=gen) if ragged else torch.full((n,), 2)
        pos = torch.arange(2)[None, :]
        valid = pos < self.num_draft[:, None]  # [n, 2]
        self.drafts = torch.where(valid, torch.stack([d0, d1], 1), -1)
        q = torch.stack([self.q0.expand(n, VOCAB), self.Q1[d0]], 1)
        self.draft_probs = q.masked_fill(~valid[..., None], float("nan"))
        p = torch.stack([self.p0.expand(n, VOCAB), self.P1[d0], self.p2.expand(n, VOCAB)], 1)
        self.target_probs = p.masked_fill(
            ~(torch.arange(3) <= self.num_draft[:, None])[..., None], float("nan")
        )

    def first_two(self, tokens: torch.Tensor, num_emitted: torch.Tensor) -> torch.Tensor:
        """[n] cell id y0 * V + y1; where only y0 was emitted, y1 comes from the next target step."""
        y0 = tokens[:, 0]
        y1 = torch.where(num_emitted >= 2, tokens[:, 1], _draw(self.P1[y0], self.gen))
        return y0 * VOCAB + y1

    @property
    def joint(self) -> torch.Tensor:  # [V * V]
        return (self.p0[:, None] * self.P1).flatten()


@pytest.mark.parametrize(
    ("one_hot_draft", "ragged"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_emitted_tokens_follow_the_target(one_hot_draft: bool, ragged: bool) -> None:
    chain = TwoStepChain(seed=11, ragged=ragged)
    result = accept_drafts(
        chain.drafts,
        chain.num_draft,
        None if one_hot_draft else chain.draft_probs,
        chain.target_probs,
        default_generator=chain.gen,
    )
    assert chi_square_pvalue(result.token_ids[:, 0], chain.p0) > ALPHA
    cells = chain.first_two(result.token_ids, result.num_emitted)
    assert chi_square_pvalue(cells, chain.joint) > ALPHA


def _broken_first_token(chain: TwoStepChain, rule: str) -> torch.Tensor:  # [n]
    d0 = chain.drafts[:, 0]
    if rule == "always_accept":
        return d0
    u = torch.rand(d0.shape, generator=chain.gen)
    accepted = u * chain.q0[d0] < chain.p0[d0]
    recovered_from_p = _draw(chain.p0.expand(d0.numel(), VOCAB), chain.gen)
    return torch.where(accepted, d0, recovered_from_p)


@pytest.mark.parametrize("rule", ["always_accept", "recover_from_p"])
def test_chi_square_detects_broken_rules(rule: str) -> None:
    chain = TwoStepChain(seed=11, ragged=False)
    assert chi_square_pvalue(_broken_first_token(chain, rule), chain.p0) < 1e-9


@pytest.mark.parametrize("one_hot_draft", [False, True])
def test_first_position_acceptance_rate(one_hot_draft: bool) -> None:
    chain = TwoStepChain(seed=12, ragged=False)
    draft_probs = None if one_hot_draft else chain.draft_probs
    result = accept_drafts(
        chain.drafts, chain.num_draft, draft_probs, chain.target_probs, default_generator=chain.gen
    )
    # E[accept] = sum_x min(p, q); a one-hot draft at d ~ q0 is accepted with p0(d).
    expected = (
        (chain.q0 * chain.p0).sum() if one_hot_draft else torch.minimum(chain.p0, chain.q0).sum()
    )
    rate = (result.num_accepted >= 1).double().mean()
    sigma = math.sqrt(expected * (1 - expected) / NUM_SAMPLES)
    assert abs(rate - expected) < 4.5 * sigma


def _greedy_reference(drafts: list[int], k: int, argmaxes: list[int]) -> list[int]:
    out = []
    for i in range(k):
        if drafts[i] != argmaxes[i]:
            break
        out.append(drafts[i])
    return out + [argmaxes[len(out)]]


@pytest.mark.parametrize("one_hot_draft", [False, True])
def test_greedy_target_is_exact_match_plus_argmax(one_hot_draft: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    batch, k_max, vocab = 400, 4, 6
    logits = torch.randn(batch * (k_max + 1), vocab, generator=gen)
    greedy = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * len(logits))
    target = processed_probs(logits, greedy).view(batch, k_max + 1, vocab)
    argmaxes = logits.argmax(-1).view(batch, k_max + 1)
    guesses = torch.randint(vocab, (batch, k_max), generator=gen)
    drafts = torch.where(
        torch.rand(batch, k_max, generator=gen) < 0.7, argmaxes[:, :k_max], guesses
    )
    num_draft = torch.randint(0, k_max + 1, (batch,), generator=gen)
    drafts = drafts.masked_fill(torch.arange(k_max) >= num_draft[:, None], -1)
    draft_probs = (
        None if one_hot_draft else torch.rand(batch, k_max, vocab, generator=gen).softmax(-1)
    )
    result = accept_drafts(drafts, num_draft, draft_probs, target, default_generator=gen)
    expected = [
        _greedy_reference(d, k, a)
        for d, k, a in zip(drafts.tolist(), num_draft.tolist(), argmaxes.tolist(), strict=True)
    ]
    assert result.tolist() == expected


def test_seeded_row_reproduces_whatever_the_batch() -> None:
    gen = torch.Generator().manual_seed(5)
    vocab, k = 50, 3
    drafts = torch.randint(vocab, (1, k), generator=gen)
    q = torch.randn(1, k, vocab, generator=gen).softmax(-1)
    p = torch.randn(1, k + 1, vocab, generator=gen).softmax(-1)
    alone = accept_drafts(drafts, torch.tensor([k]), q, p, [PositionNoise(9)], [40])
    others, k_max = 5, 6
    batch_drafts = torch.randint(vocab, (others + 1, k_max), generator=gen)
    batch_drafts[2, :k], batch_drafts[2, k:] = drafts[0], -1
    batch_q = torch.randn(others + 1, k_max, vocab, generator=gen).softmax(-1)
    batch_q[2, :k] = q[0]
    batch_p = torch.randn(others + 1, k_max + 1, vocab, generator=gen).softmax(-1)
    batch_p[2, : k + 1] = p[0]
    num_draft = torch.tensor([6, 0, k, 2, 6, 1])
    noise = [None, None, PositionNoise(9), None, PositionNoise(1), None]
    together = accept_drafts(
        batch_drafts, num_draft, batch_q, batch_p, noise, [0, 0, 40, 0, 7, 0], default_generator=gen
    )
    assert together.tolist()[2] == alone.tolist()[0]


def test_seeded_rows_emit_the_keyed_samples_of_plain_decoding() -> None:
    """Whatever the drafts (right, wrong, none) a seeded row emits, position by position, the
    token a plain sampler draws with that position's generator."""
    gen = torch.Generator().manual_seed(8)
    rows, k, vocab = 64, 4, 12
    p = torch.randn(rows, k + 1, vocab, generator=gen).mul(2).softmax(-1)
    noise, positions = [PositionNoise(s) for s in range(rows)], [3 * s for s in range(rows)]
    plain = torch.stack([  # [rows, k + 1] what plain sampling draws at each position
        torch.stack([sample_from_weights(p[b, i : i + 1], [noise[b].generator(positions[b] + i)])[0] for i in range(k + 1)])
        for b in range(rows)
    ])
    right = torch.rand(rows, k, generator=gen) < 0.6
    drafts = torch.where(right, plain[:, :k], torch.randint(vocab, (rows, k), generator=gen))
    num_draft = torch.randint(0, k + 1, (rows,), generator=gen)
    drafts = drafts.masked_fill(torch.arange(k) >= num_draft[:, None], -1)
    result = accept_drafts(drafts, num_draft, None, p, noise, positions, default_generator=gen)
    for b, emitted in enumerate(result.tolist()):
        assert emitted == plain[b, : len(emitted)].tolist()
        n = len(emitted) - 1  # accepted drafts: those equal to the keyed samples, in a row
        assert n == int(((drafts[b] == plain[b, :k]) & (torch.arange(k) < num_draft[b])).long().cumprod(0).sum())


def test_identical_draft_and_target_accept_everything() -> None:
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(300, 3, 10, generator=gen).softmax(-1)
    drafts = _draw(q.view(-1, 10), gen).view(300, 3)
    p = torch.cat([q, q[:, :1]], 1)
    result = accept_drafts(drafts, torch.full((300,), 3), q, p, default_generator=gen)
    assert (result.num_accepted == 3).all() and (result.token_ids[:, :3] == drafts).all()


def test_residual_rounding_falls_back_to_target() -> None:
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2000, 1, 10, generator=gen).softmax(-1)
    p = torch.cat([q * 0.999, q], 1)  # p < q everywhere: rejections with an all-zero residual
    drafts = _draw(q[:, 0], gen)[:, None]
    result = accept_drafts(drafts, torch.ones(2000, dtype=torch.int64), q, p, default_generator=gen)
    rejected = result.num_accepted == 0
    assert rejected.any()
    recovered = result.token_ids[rejected, 0]
    assert (p[rejected, 0].gather(-1, recovered[:, None]) > 0).all()


def test_output_layout_and_padding() -> None:
    p = torch.zeros(3, 3, 4)
    p[:, :, 2] = 1.0  # the target always wants token 2
    drafts = torch.tensor([[2, 2], [2, 1], [-1, -1]])
    result = accept_drafts(drafts, torch.tensor([2, 2, 0]), None, p)
    assert result.token_ids.tolist() == [[2, 2, 2], [2, 2, -1], [2, -1, -1]]
    assert result.num_accepted.tolist() == [2, 1, 0]
    assert result.num_emitted.tolist() == [3, 2, 1]
    assert result.tolist() == [[2, 2, 2], [2, 2], [2]]


def test_no_drafts_at_all_samples_from_the_first_position() -> None:
    p = torch.tensor([[[0.0, 1.0, 0.0]]])
    result = accept_drafts(
        torch.empty(1, 0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), None, p
    )
    assert result.token_ids.tolist() == [[1]]


def test_pad_ragged() -> None:
    flat = torch.arange(6.0)[:, None].expand(6, 2)
    padded = pad_ragged(flat, torch.tensor([1, 3, 2]), width=3)
    assert padded[..., 0].tolist() == [[0, 0, 0], [1, 2, 3], [4, 5, 0]]
    assert padded.shape == (3, 3, 2)


@pytest.mark.parametrize("sampled_draft", [False, True])
def test_greedy_fast_path_equals_the_general_rule_on_one_hot_targets(sampled_draft):
    gen = torch.Generator().manual_seed(3)
    rows, k_max, vocab = 64, 5, 12
    argmax = torch.randint(0, vocab, (rows, k_max + 1), generator=gen)
    num_draft = torch.randint(0, k_max + 1, (rows,), generator=gen)
    agree = torch.rand(rows, k_max, generator=gen) < 0.7
    drafts = torch.where(agree, argmax[:, :k_max], torch.randint(0, vocab, (rows, k_max), generator=gen))
    drafts = torch.where(torch.arange(k_max)[None, :] < num_draft[:, None], drafts, -1)
    target = torch.nn.functional.one_hot(argmax, vocab).float()  # greedy rows: one-hot p
    q = torch.rand(rows, k_max, vocab, generator=gen).softmax(-1) if sampled_draft else None
    general = accept_drafts(drafts, num_draft, q, target, default_generator=gen)
    fast = accept_greedy(drafts, num_draft, argmax)
    assert torch.equal(fast.num_accepted, general.num_accepted) and torch.equal(fast.token_ids, general.token_ids)
    past = torch.arange(k_max + 1)[None, :] > num_draft[:, None]  # columns a verify did not compute
    noisy = accept_greedy(drafts, num_draft, torch.where(past, torch.randint(0, vocab, argmax.shape, generator=gen), argmax))
    assert torch.equal(noisy.token_ids, fast.token_ids) and torch.equal(noisy.num_accepted, fast.num_accepted)
    assert 0 < fast.num_accepted.sum() < num_draft.sum()  # both accepts and rejections happened
