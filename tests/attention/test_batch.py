"""build_forward_batch's slots, positions, logit rows and masks; pack/unpack round trips."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import ancestor_mask

from speculant.attention.batch import ForwardBatch, SeqInput, build_forward_batch


@st.composite
def seq_inputs(draw, page_size: int) -> SeqInput:
    kv_start = draw(st.integers(0, 12))
    q_len = draw(st.integers(1, 6))
    num_pages = -(-(kv_start + q_len) // page_size)
    pages = draw(st.lists(st.integers(0, 63), min_size=num_pages, max_size=num_pages, unique=True))
    tree = None
    if draw(st.booleans()):
        parents = [draw(st.integers(-1, i - 1)) for i in range(q_len)]
        tree = ancestor_mask(parents)
    positions = draw(st.none() | st.just([kv_start + i for i in range(q_len)]))
    return SeqInput(
        token_ids=draw(st.lists(st.integers(0, 255), min_size=q_len, max_size=q_len)),
        kv_start=kv_start,
        page_table=pages,
        positions=positions,
        logits=draw(st.sampled_from(["last", "all", "none"])),
        tree_mask=tree,
    )


@st.composite
def batches(draw) -> tuple[list[SeqInput], int]:
    page_size = draw(st.integers(1, 5))
    return draw(st.lists(seq_inputs(page_size), min_size=1, max_size=5)), page_size


@settings(max_examples=150, deadline=None)
@given(batches())
def test_build_matches_per_sequence_description(case) -> None:
    seqs, page_size = case
    fb = build_forward_batch(seqs, page_size)
    t = 0
    expected_logits, expected_mask = [], []
    for b, s in enumerate(seqs):
        n = len(s.token_ids)
        assert fb.cu_seqlens_q[b] == t and fb.kv_lens[b] == s.kv_start + n
        assert fb.page_table[b, : len(s.page_table)].tolist() == s.page_table
        for i in range(n):
            slot = s.kv_start + i
            assert (
                fb.slot_mapping[t + i]
                == s.page_table[slot // page_size] * page_size + slot % page_size
            )
            assert fb.positions[t + i] == (s.positions[i] if s.positions else slot)
            assert fb.input_ids[t + i] == s.token_ids[i]
        expected_logits += {"all": list(range(t, t + n)), "last": [t + n - 1], "none": []}[s.logits]
        mask = s.tree_mask if s.tree_mask is not None else np.tri(n, dtype=bool)
        expected_mask += mask.astype(np.int64).reshape(-1).tolist()
        t += n
    assert fb.num_tokens == t and fb.cu_seqlens_q[-1] == t
    assert fb.logits_indices.tolist() == expected_logits
    any_tree = any(s.tree_mask is not None for s in seqs)
    assert fb.custom_mask.tolist() == (expected_mask if any_tree else [])


def _assert_same(a: ForwardBatch, b: ForwardBatch) -> None:
    for name in (f.name for f in dataclasses.fields(ForwardBatch)):
        x, y = getattr(a, name), getattr(b, name)
        if not isinstance(x, np.ndarray):  # page_size, sliding_window (host-side, None here)
            assert x == y, name
            continue
        y = y.numpy() if isinstance(y, torch.Tensor) else y
        assert x.shape == y.shape and (x == y).all(), name


@settings(max_examples=100, deadline=None)
@given(batches())
def test_pack_unpack_round_trip(case) -> None:
    seqs, page_size = case
    fb = build_forward_batch(seqs, page_size)
    host = fb.pack()
    assert host.dtype == np.int64 and host.ndim == 1
    _assert_same(fb, ForwardBatch.unpack(host))
    _assert_same(
        fb, ForwardBatch.unpack(torch.from_numpy(host.copy()), header=host)
    )  # device-style


def test_chunk_crossing_a_page_and_no_logits() -> None:
    fb = build_forward_batch(
        [SeqInput([5], 0, [7], logits="none"), SeqInput([1, 2], 3, [2, 9], logits="all")], 4
    )
    assert fb.slot_mapping.tolist() == [28, 11, 36]
    assert fb.page_table.tolist() == [[7, 0], [2, 9]]
    assert fb.logits_indices.tolist() == [1, 2]
    assert fb.kv_lens.tolist() == [1, 5] and fb.q_lens.tolist() == [1, 2]
