"""The Llama family and its draft heads on one rank of a tensor-parallel group.

A rank's model is a Llama with its own heads and MLP units (`shard_arch`): the fused q/k/v and
gate/up products are column-parallel (sharded before they are fused, so each rank's fused
weight is [its q | its k | its v]), o and down are row-parallel (each rank's partial product
is summed over ranks), the embedding and lm_head hold a block of the vocabulary: an embedding
row comes from the rank holding it (summed, the others add zeros), and the logits of every
rank's block are gathered, so every rank ends a forward with the same hidden states and logits.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from speculant.config import ArchConfig
from speculant.distributed.group import TPGroup
from speculant.distributed.sharding import pad_rows, shard_arch, shard_weights
from speculant.layers.linear import Linear
from speculant.models.draft_head import DraftHead
from speculant.models.llama import LayerWeights, LlamaForCausalLM, decoder_layer

_VOCAB_WEIGHTS = ("model.embed_tokens.weight", "lm_head.weight")


class RowParallel:
    """A product over this rank's input columns, summed over ranks (o, down: no bias)."""

    def __init__(self, inner: Linear, group: TPGroup) -> None:
        self.inner, self.group = inner, group

    @property
    def shape(self) -> torch.Size:
        return self.inner.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in / N] -> [T, out]
        return self.group.all_reduce(self.inner(x))


class VocabParallelHead:
    """The lm_head over this rank's vocabulary block; the blocks' logits gathered in order."""

    def __init__(self, inner: Linear, group: TPGroup, vocab_size: int) -> None:
        self.inner, self.group, self.vocab_size = inner, group, vocab_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.group.all_gather_last(self.inner(x))[:, : self.vocab_size]


class TensorParallelLlama(LlamaForCausalLM):
    """One rank's part of a Llama-family model; `load_weights` takes this rank's slices."""

    def __init__(self, arch: ArchConfig, group: TPGroup, device: torch.device, dtype: torch.dtype, weights: str = "fp32") -> None:
        super().__init__(shard_arch(arch, group.shard), device, dtype, weights)
        self.group, self.full_arch = group, arch
        self.vocab_start, _ = group.shard.vocab_block(arch.vocab_size)
        self.vocab_rows = group.shard.vocab_rows(arch.vocab_size)

    def load_weights(self, weights: dict) -> None:
        padded = {name: pad_rows(weights[name], self.vocab_rows) for name in _VOCAB_WEIGHTS if name in weights}
        super().load_weights({**weights, **padded})
        self.lm_head = VocabParallelHead(self.lm_head, self.group, self.arch.vocab_size)
        for layer in self.layers:
            row_parallel(layer, self.group)

    def head_layer(self, weights: dict) -> LayerWeights:
        """A draft head's decoder layer (its `layer.*` slices) built as this model's layers are."""
        prefix = "model.layers.0."
        renamed = {prefix + name.removeprefix("layer."): w for name, w in weights.items() if name.startswith("layer.")}
        layer = self._load_layer(lambda name: renamed[name].to(self.device, self.dtype), renamed, 0)
        row_parallel(layer, self.group)
        return layer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        local = input_ids - self.vocab_start
        inside = (local >= 0) & (local < self.vocab_rows)
        x = F.embedding(local.clamp(0, self.vocab_rows - 1), self.embed_tokens)
        return self.group.all_reduce(x.masked_fill(~inside[:, None], 0))


def row_parallel(layer: LayerWeights, group: TPGroup) -> None:
    layer.o, layer.down = RowParallel(layer.o, group), RowParallel(layer.down, group)


def sharded_head(target: TensorParallelLlama, head, device: torch.device, dtype: torch.dtype, weights_mode: str) -> DraftHead:
    """A draft head (`HeadCheckpoint`) cut like the target: its decoder layer's heads and MLP
    units are this rank's, eh_proj and the norms whole; embedding and lm_head are the target's.
    The head's block is rebuilt as the target's own sharded layer (row-parallel o/down); the
    block `DraftHead` built from the same slices is dropped."""
    weights = shard_weights(head.weights, target.full_arch, target.group.shard)
    model = DraftHead(target, head.config.variant, weights, device, dtype, weights_mode)
    layer = target.head_layer(weights)
    model.modules.block = functools.partial(decoder_layer, model.arch, layer)
    return model
