"""The torch attention backend against a naive dense softmax per sequence, over mixed ragged
batches: prefill from 0, a chunk after a cached prefix, decode, multi-token verification and a
draft tree, with pages scattered across the cache and grouped-query heads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from testkit import ancestor_mask

from speculant.attention.batch import SeqInput, build_forward_batch
from speculant.attention.torch_backend import TorchAttention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, NUM_PAGES = 6, 2, 8, 4, 40
SCALE = HEAD_DIM**-0.5
ATOL = 1e-5  # float32, against a float64 reference


@dataclass
class Case:
    kv_start: int  # tokens already in the cache
    q_len: int  # new tokens this forward
    tree_parents: list[int] | None = None  # parent of each new token (-1: the cached prefix)


def _reference(q, keys, values, kv_start: int, new_mask: np.ndarray) -> torch.Tensor:
    """Dense attention in float64. q [n, H, D]; keys/values [kv_start + n, Hkv, D]."""
    n = q.shape[0]
    group = NUM_HEADS // NUM_KV_HEADS
    k = keys.double().repeat_interleave(group, dim=1)  # [L, H, D]
    v = values.double().repeat_interleave(group, dim=1)
    visible = torch.zeros(n, kv_start + n, dtype=torch.bool)
    visible[:, :kv_start] = True
    visible[:, kv_start:] = torch.from_numpy(new_mask)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), k) * SCALE
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", probs, v).reshape(n, NUM_HEADS * HEAD_DIM)


def _run(cases: list[Case], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    free = list(rng.permutation(NUM_PAGES))  # pages scattered over the whole cache
    k_cache = torch.randn(NUM_PAGES * PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen)  # garbage
    v_cache = torch.randn(NUM_PAGES * PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    inputs, full_k, full_v, qs, masks = [], [], [], [], []
    for c in cases:
        length = c.kv_start + c.q_len
        table = [int(free.pop()) for _ in range(-(-length // PAGE_SIZE))]
        slots = [table[i // PAGE_SIZE] * PAGE_SIZE + i % PAGE_SIZE for i in range(length)]
        keys = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen)
        values = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen)
        k_cache[slots[: c.kv_start]] = keys[: c.kv_start]  # the prefix an earlier forward wrote
        v_cache[slots[: c.kv_start]] = values[: c.kv_start]
        tree = None if c.tree_parents is None else ancestor_mask(c.tree_parents)
        masks.append(np.tri(c.q_len, dtype=bool) if tree is None else tree)
        inputs.append(SeqInput([0] * c.q_len, c.kv_start, table, tree_mask=tree))
        full_k.append(keys)
        full_v.append(values)
        qs.append(torch.randn(c.q_len, NUM_HEADS, HEAD_DIM, generator=gen))
    fb = build_forward_batch(inputs, PAGE_SIZE)
    backend = TorchAttention(torch.device("cpu"))
    new_k = torch.cat([k[c.kv_start :] for k, c in zip(full_k, cases, strict=True)])
    new_v = torch.cat([v[c.kv_start :] for v, c in zip(full_v, cases, strict=True)])
    out = backend.forward(
        torch.cat(qs), new_k, new_v, k_cache, v_cache, backend.plan(fb, torch.device("cpu")), SCALE
    )
    return out, fb, (k_cache, v_cache), (inputs, full_k, full_v, qs, masks)


MIXES = {
    "prefill_from_0": [Case(0, 7)],
    "chunk_after_prefix": [Case(9, 5)],
    "decode_batch": [Case(3, 1), Case(11, 1), Case(4, 1)],
    "decode_equal_lengths": [Case(6, 1), Case(6, 1)],  # the mask-free path
    "verification": [Case(10, 5), Case(2, 3)],
    "tree": [Case(6, 6, tree_parents=[-1, 0, 0, 1, 1, 2])],
    "mixed": [
        Case(0, 9),  # prefill
        Case(8, 1),  # decode
        Case(5, 4),  # chunk continuing after a prefix
        Case(13, 4),  # verification of 3 drafts
        Case(7, 7, tree_parents=[-1, 0, 0, 1, 2, 2, 4]),  # tree
        Case(0, 1),  # one-token prompt
    ],
    "prefill_chunks_with_decodes": [  # long and short queries: one SDPA call per group
        Case(3, 1),
        Case(0, 20),
        Case(11, 1),
        Case(9, 5),
        Case(2, 18),
    ],
}


def test_long_and_short_queries_are_attended_in_groups() -> None:
    cases = MIXES["prefill_chunks_with_decodes"]
    fb = _run(cases)[1]
    meta = TorchAttention(torch.device("cpu")).plan(fb, torch.device("cpu"))
    assert [g.seqs.tolist() for g in meta.groups] == [[0, 2], [3], [1, 4]]  # decode, verification, prefill
    assert [g.meta.max_q for g in meta.groups] == [1, 5, 20] and meta.mask is None
    assert TorchAttention(torch.device("cpu")).plan(_run(MIXES["mixed"])[1], torch.device("cpu")).groups is None  # a tree


@pytest.mark.parametrize("name", list(MIXES))
def test_matches_dense_reference(name: str) -> None:
    cases = MIXES[name]
    out, fb, _, (inputs, full_k, full_v, qs, masks) = _run(cases)
    assert out.shape == (fb.num_tokens, NUM_HEADS * HEAD_DIM)
    t = 0
    for c, keys, values, q, mask in zip(cases, full_k, full_v, qs, masks, strict=True):
        expected = _reference(q, keys, values, c.kv_start, mask)
        torch.testing.assert_close(out[t : t + c.q_len].double(), expected, atol=ATOL, rtol=0)
        t += c.q_len


@pytest.mark.parametrize("name", ["mixed", "tree"])
def test_writes_new_kv_to_its_slots_only(name: str) -> None:
    cases = MIXES[name]
    _, fb, (k_cache, v_cache), (inputs, full_k, full_v, _, _) = _run(cases)
    for s, keys, values in zip(inputs, full_k, full_v, strict=True):
        length = len(keys)
        slots = [s.page_table[i // PAGE_SIZE] * PAGE_SIZE + i % PAGE_SIZE for i in range(length)]
        torch.testing.assert_close(k_cache[slots], keys, atol=0, rtol=0)
        torch.testing.assert_close(v_cache[slots], values, atol=0, rtol=0)


def test_tree_siblings_do_not_see_each_other() -> None:
    """Perturbing a sibling's key/value leaves a node's output unchanged; its parent's does not."""
    cases = [Case(4, 3, tree_parents=[-1, 0, 0])]
    out, _, (k_cache, v_cache), (inputs, full_k, full_v, qs, _) = _run(cases, seed=1)
    backend = TorchAttention(torch.device("cpu"))
    fb = build_forward_batch(inputs, PAGE_SIZE)
    for changed, unchanged_rows, changed_rows in ((2, [0, 1], [2]), (1, [0, 2], [1])):
        k_new = full_k[0][4:].clone()
        k_new[changed] += 3.0
        again = backend.forward(
            qs[0],
            k_new,
            full_v[0][4:],
            k_cache,
            v_cache,
            backend.plan(fb, torch.device("cpu")),
            SCALE,
        )
        torch.testing.assert_close(again[unchanged_rows], out[unchanged_rows], atol=1e-6, rtol=0)
        assert not torch.allclose(again[changed_rows], out[changed_rows], atol=1e-3)


def test_a_tree_mask_may_cover_cached_slots_before_the_new_tokens():
    """A head's level of tree entries: each sees the whole prefix before the tree, its ancestor
    entries among the cached ones, and itself."""
    from speculant.attention.torch_backend import build_mask

    tree_mask = np.array([[1, 0, 0, 1, 0], [0, 1, 0, 0, 1]], dtype=bool)  # 3 cached entries, 2 new
    fb = build_forward_batch([SeqInput([0, 0], 6, [0, 1], tree_mask=tree_mask)], page_size=4)
    mask = build_mask(fb, 2, 8)[0]
    assert mask[:, :3].all()  # the prefix before the tree entries
    assert (mask[:, 3:] == tree_mask).all()
    with pytest.raises(ValueError, match="tree_mask must be"):
        build_forward_batch([SeqInput([0, 0], 1, [0], tree_mask=np.ones((2, 4), dtype=bool))], page_size=4)


def test_a_sliding_window_follows_query_positions():
    """A window of 3: a chain query at position p sees keys p-2..p; a tree node sees the prefix
    keys within 3 positions of its own, however many siblings sit in slots before it."""
    import dataclasses

    from speculant.attention.torch_backend import build_mask

    chain = build_forward_batch([SeqInput([0, 0], 5, [0, 1])], page_size=4)  # positions 5, 6
    mask = build_mask(dataclasses.replace(chain, sliding_window=3), 2, 7)[0]
    assert mask.tolist() == [[j in (3, 4, 5) for j in range(7)], [j in (4, 5, 6) for j in range(7)]]
    parents = [-1, 0, 0]  # root at position 5, two children at 6 in slots 6 and 7
    tree = build_forward_batch([SeqInput([0, 0, 0], 5, [0, 1], positions=[5, 6, 6], tree_mask=ancestor_mask(parents))], page_size=4)
    mask = build_mask(dataclasses.replace(tree, sliding_window=3), 3, 8)[0]
    assert mask[2].tolist() == [j in (4, 5, 7) for j in range(8)]  # prefix 4, root 5, itself 7
