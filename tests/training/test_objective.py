"""The head's training objective: the unrolled chain's attention mask, and attention in blocks of
whole sequences against one block."""

from __future__ import annotations

import torch

from speculant.models.head import init_head_weights
from speculant.training.batches import build_batch, sequence_refs
from speculant.training.hidden import load_shards
from speculant.training.objective import HeadObjective, _chain_mask


def _whole_batch(hidden_dir, max_entries: int = 100):
    _, shards = load_shards(hidden_dir)
    refs = sequence_refs(shards)
    return build_batch(shards, refs, list(range(len(refs))), max_entries=max_entries)


def test_chain_mask_of_an_unrolled_step():
    seq_ids, local = torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 1, 2, 0, 1])
    step1 = _chain_mask(seq_ids, local, 1)
    assert step1.tolist() == [
        [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1],
    ]
    step2 = _chain_mask(seq_ids, local, 2).int()
    # entry 2 of sequence 0: step-1 entries 0..1 (the target's states), its own step-2 entry
    assert step2[2].tolist() == [1, 1, 0, 0, 0] + [0, 0, 1, 0, 0]
    assert step2[4].tolist() == [0, 0, 0, 1, 0] + [0, 0, 0, 0, 1]


def test_attention_in_blocks_equals_one_block(hidden_dir, target):
    batch = _whole_batch(hidden_dir)
    weights = init_head_weights(target.arch, "normed", seed=3)
    results = []
    for block in (1, 10**9):  # every sequence alone; the whole batch under one mask
        model = HeadObjective(target.arch, "normed", weights, target.embed, target.lm_head, None, unroll=3, hidden_weight=0.1)
        model.attention_block = block
        loss, _ = model(batch, num_global=100)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)

