"""The device token pool: rows per request, gathers and scatters on the device."""

from __future__ import annotations

import pytest
import torch

from speculant.core import Request
from speculant.engine.token_pool import TokenPool
from speculant.sampling.params import SamplingParams


def request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams())


def test_admit_gather_write_release():
    pool = TokenPool(num_slots=2, max_len=8, device=torch.device("cpu"))
    a, b = request("a", [5, 6, 7]), request("b", [9])
    pool.admit([a, b])
    assert pool.gather([a, b], [[0, 2], [0]]).tolist() == [5, 7, 9]
    # a verify step: row b emitted 2 tokens, row a 1; -1 pads rows past their counts
    pool.write([a, b], torch.tensor([[11, -1], [12, 13]]), [3, 1])
    assert pool.gather([a, b], [[3], [1, 2]]).tolist() == [11, 12, 13]
    assert pool.gather([a], [[0, 1, 2, 3]]).dtype == torch.int64
    pool.release(a)
    c = request("c", [1, 2])
    pool.admit([c])  # takes a's row, written afresh
    assert pool.gather([c, b], [[0, 1], [0]]).tolist() == [1, 2, 9]


def test_writes_past_the_width_are_dropped_and_a_full_pool_says_so():
    pool = TokenPool(num_slots=1, max_len=4, device=torch.device("cpu"))
    a = request("a", [1, 2, 3])
    pool.admit([a])
    pool.write([a], torch.tensor([[7, 8, 9]]), [3])  # positions 3, 4, 5: only 3 fits
    assert pool.gather([a], [[3]]).tolist() == [7]
    with pytest.raises(RuntimeError, match="token pool is full"):
        pool.admit([request("b", [4])])
