"""Which rows or columns of each weight a rank holds (Megatron-style tensor parallelism).

Column-parallel (split the output rows): q/k/v by attention heads, gate/up by the MLP's
intermediate units, the embedding and lm_head by vocabulary rows. Row-parallel (split the input
columns; the partial products are summed over ranks): o and down. KV heads are split in
contiguous blocks as evenly as they go (the first `num_kv_heads % N` ranks hold one more), and
each rank's query heads are the ones reading its KV heads, so grouped-query attention stays
rank-local. The vocabulary is split in blocks of ceil(V / N) rows, the last padded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from speculant.config import ArchConfig

# (dim, start, stop): the part of a weight a rank keeps; None: the whole weight (norms, eh_proj)
Slice = tuple[int, int, int] | None


@dataclass(frozen=True)
class Shard:
    rank: int
    world_size: int

    def block(self, n: int) -> tuple[int, int]:
        """[start, stop) of this rank's part of n units split as evenly as they go."""
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def vocab_rows(self, vocab_size: int) -> int:
        """Rows of every rank's (padded) vocabulary block."""
        return -(-vocab_size // self.world_size)

    def vocab_block(self, vocab_size: int) -> tuple[int, int]:
        rows = self.vocab_rows(vocab_size)
        start = min(self.rank * rows, vocab_size)
        return start, min(start + rows, vocab_size)


def check_shardable(arch: ArchConfig, world_size: int) -> None:
    """Raise ValueError naming what keeps `arch` from being split over `world_size` ranks."""
    if arch.mla is not None or arch.moe is not None:
        raise ValueError(f"tensor_parallel_size={world_size}: the {arch.family} family is not sharded (the Llama family is)")
    if arch.num_kv_heads < world_size:
        raise ValueError(f"tensor_parallel_size={world_size} exceeds the model's {arch.num_kv_heads} KV heads (each rank holds whole KV heads)")
    if arch.intermediate_size < world_size:
        raise ValueError(f"tensor_parallel_size={world_size} exceeds the model's intermediate_size {arch.intermediate_size}")


def shard_arch(arch: ArchConfig, shard: Shard) -> ArchConfig:
    """The architecture one rank runs: its heads and MLP units (vocabulary and hidden size whole)."""
    kv_start, kv_stop = shard.block(arch.num_kv_heads)
    group = arch.num_heads // arch.num_kv_heads
    i_start, i_stop = shard.block(arch.intermediate_size)
    return dataclasses.replace(
        arch, num_heads=(kv_stop - kv_start) * group, num_kv_heads=kv_stop - kv_start, intermediate_size=i_stop - i_start
    )


def slice_of(name: str, arch: ArchConfig, shard: Shard) -> Slice:
    """The part of the weight called `name` (HF names, or a head's `layer.*` names) a rank keeps."""
    d, group = arch.head_dim, arch.num_heads // arch.num_kv_heads
    kv_start, kv_stop = shard.block(arch.num_kv_heads)
    q_rows = (kv_start * group * d, kv_stop * group * d)
    kv_rows = (kv_start * d, kv_stop * d)
    mlp = shard.block(arch.intermediate_size)
    rules = {
        "self_attn.q_proj.weight": (0, *q_rows),
        "self_attn.q_proj.bias": (0, *q_rows),
        "self_attn.k_proj.weight": (0, *kv_rows),
        "self_attn.k_proj.bias": (0, *kv_rows),
        "self_attn.v_proj.weight": (0, *kv_rows),
        "self_attn.v_proj.bias": (0, *kv_rows),
        "self_attn.o_proj.weight": (1, *q_rows),
        "mlp.gate_proj.weight": (0, *mlp),
        "mlp.up_proj.weight": (0, *mlp),
        "mlp.down_proj.weight": (1, *mlp),
    }
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (0, *shard.vocab_block(arch.vocab_size))
    suffix = name.split(".", 1)[-1] if name.startswith("layer.") else name.split(".", 3)[-1]
    return rules.get(suffix) if name.startswith(("model.layers.", "layer.")) else None


def take(tensor: torch.Tensor, part: Slice) -> torch.Tensor:
    """`tensor`'s part as its own contiguous tensor (the whole tensor is not kept)."""
    if part is None:
        return tensor
    dim, start, stop = part
    return tensor.narrow(dim, start, stop - start).contiguous()


def shard_weights(weights: dict[str, torch.Tensor], arch: ArchConfig, shard: Shard) -> dict[str, torch.Tensor]:
    """Every weight of an in-memory checkpoint or head cut to this rank's part."""
    out = {}
    for name, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensor_parallel_size > 1 shards float weights; {name!r} is quantized (load it as fp32/bf16)")
        out[name] = take(tensor, slice_of(name, arch, shard))
    return out


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` [r, ...] with zero rows appended up to `rows`."""
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))])
