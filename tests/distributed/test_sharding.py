"""Which part of each weight a rank keeps: blocks cover every unit once, a rank's query heads
read its own KV heads, and the parts put back together are the whole weight."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from testkit import TinyCheckpoint, arch_of, tiny_hf_model

from speculant.distributed.sharding import (
    Shard,
    check_shardable,
    pad_rows,
    shard_arch,
    shard_weights,
    slice_of,
)


@pytest.mark.parametrize("n, world", [(9, 2), (3, 2), (8, 4), (5, 3), (2, 2)])
def test_blocks_cover_every_unit_once(n, world):
    blocks = [Shard(r, world).block(n) for r in range(world)]
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    sizes = [stop - start for start, stop in blocks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # rank 0 holds the most


def test_uneven_heads_follow_their_kv_groups():
    """SmolLM2-135M's shape: 9 query heads over 3 KV heads split over 2 ranks."""
    arch = dataclasses.replace(arch_of(tiny_hf_model("llama")), num_heads=9, num_kv_heads=3, head_dim=64, hidden_size=576, intermediate_size=1536)
    local = [shard_arch(arch, Shard(r, 2)) for r in range(2)]
    assert [(a.num_heads, a.num_kv_heads, a.intermediate_size) for a in local] == [(6, 2, 768), (3, 1, 768)]
    assert slice_of("model.layers.0.self_attn.q_proj.weight", arch, Shard(1, 2)) == (0, 6 * 64, 9 * 64)
    assert slice_of("model.layers.0.self_attn.k_proj.weight", arch, Shard(1, 2)) == (0, 2 * 64, 3 * 64)
    assert slice_of("model.layers.0.self_attn.o_proj.weight", arch, Shard(1, 2)) == (1, 6 * 64, 9 * 64)


def test_parts_put_together_are_the_whole():
    ckpt = TinyCheckpoint(tiny_hf_model("qwen2", vocab_size=250))  # q/k/v biases; 250 rows: a padded last vocab block
    parts = [shard_weights(ckpt.weights, ckpt.arch, Shard(r, 2)) for r in range(2)]
    for name, whole in ckpt.weights.items():
        part = slice_of(name, ckpt.arch, Shard(0, 2))
        if part is None:
            assert all(p[name] is whole for p in parts), name  # norms: whole on every rank
        else:
            assert torch.equal(torch.cat([p[name] for p in parts], part[0]), whole), name


def test_more_ranks_than_kv_heads_is_refused():
    with pytest.raises(ValueError, match="exceeds the model's 2 KV heads"):
        check_shardable(arch_of(tiny_hf_model("llama")), 3)


def test_head_weights_are_cut_like_the_target():
    arch = arch_of(tiny_hf_model("llama"))
    assert slice_of("layer.mlp.down_proj.weight", arch, Shard(1, 2)) == (1, 64, 128)
    assert slice_of("eh_proj.weight", arch, Shard(1, 2)) is None
    assert slice_of("vocab_map", arch, Shard(1, 2)) is None


def test_pad_rows_appends_zero_rows():
    x = torch.ones(3, 2)
    assert torch.equal(pad_rows(x, 5), torch.cat([x, torch.zeros(2, 2)]))
