"""The logit adjustments as pure functions: packed grammar masks, bans, biases and penalties."""

from __future__ import annotations

import torch

from speculant.sampling.logit_adjust import LogitAdjustments, adjust_logits, unpack_bitmask


def _pack(allowed: torch.Tensor) -> torch.Tensor:  # [R, V] bool -> [R, W] int32
    rows, vocab = allowed.shape
    words = torch.zeros(rows, (vocab + 31) // 32, dtype=torch.int64)
    for t in range(vocab):
        words[:, t // 32] |= allowed[:, t].long() << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_unpack_inverts_pack_including_bit_31():
    allowed = torch.rand(3, 70, generator=torch.Generator().manual_seed(0)) < 0.5
    allowed[:, 31] = True
    assert torch.equal(unpack_bitmask(_pack(allowed), 70), allowed)


def test_grammar_mask_and_bans_set_minus_infinity_and_a_ban_yields_to_the_grammar():
    logits = torch.randn(3, 8)
    allowed = torch.zeros(3, 8, dtype=torch.bool)
    allowed[0, [1, 2]] = True
    allowed[1, [2]] = True  # only the banned token: the grammar wins
    allowed[2] = False  # nothing in the vocabulary allowed: the grammar leaves the row alone
    banned = torch.zeros(3, 8, dtype=torch.bool)
    banned[:, 2] = True
    out = adjust_logits(logits, LogitAdjustments(allowed=_pack(allowed), banned=banned))
    assert torch.isfinite(out[0]).tolist() == [False, True] + [False] * 6
    assert torch.isfinite(out[1]).tolist() == [False, False, True] + [False] * 5
    assert torch.equal(out[2], logits[2].masked_fill(banned[2], float("-inf")))


def test_penalties_and_bias():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    counts = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    seen = torch.tensor([[True, True, False, False]])
    adj = LogitAdjustments(
        bias=torch.tensor([[0.0, 0.0, 0.0, 5.0]]), output_counts=counts, frequency=torch.tensor([0.5]),
        presence=torch.tensor([0.25]), seen=seen, repetition=torch.tensor([2.0]),
    )
    out = adjust_logits(logits, adj)
    assert torch.allclose(out, torch.tensor([[2.0 / 2 - 1.0 - 0.25, -2.0 * 2 - 0.5 - 0.25, 1.0, 5.5]]))


def test_neutral_values_leave_the_bits_alone():
    logits = torch.randn(4, 50)
    adj = LogitAdjustments(
        bias=torch.zeros(4, 50), output_counts=torch.randint(0, 3, (4, 50)).float(), frequency=torch.zeros(4),
        presence=torch.zeros(4), seen=torch.rand(4, 50) < 0.5, repetition=torch.ones(4),
    )
    assert torch.equal(adjust_logits(logits, adj), logits)
