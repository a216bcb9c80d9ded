"""The chain verify stage's inputs: each sequence's last token then its drafts, flat, gathered
from the token pool alone (no engine)."""

from __future__ import annotations

import torch

from speculant.core import DraftProposal, Request
from speculant.engine.chain_verify import row_offsets, verify_ids
from speculant.engine.token_pool import TokenPool
from speculant.sampling.params import SamplingParams


def test_verify_ids_are_the_last_token_then_the_drafts_of_each_sequence():
    pool = TokenPool(num_slots=2, max_len=8, device=torch.device("cpu"))
    a, b = Request("a", [5, 6, 7], SamplingParams()), Request("b", [9], SamplingParams())
    pool.admit([a, b])
    proposal = DraftProposal(token_ids=torch.tensor([[20, 21], [30, -1]]), num_drafts=[2, 1])
    assert verify_ids(pool, [a, b], proposal).tolist() == [7, 20, 21, 9, 30]
    assert row_offsets([3, 2]) == [0, 3, 5]
