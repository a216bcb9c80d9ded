"""Each rank loads only its own slices of the target: from a safetensors folder through sliced
reads (no rank materialises the whole model), or cut from an in-memory checkpoint (tests)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.config import ArchConfig, EngineConfig, ModelConfig
from speculant.distributed.group import TPGroup
from speculant.distributed.model import TensorParallelLlama, sharded_head
from speculant.distributed.sharding import Shard, check_shardable, shard_weights, slice_of
from speculant.executor.loading import backend_for
from speculant.executor.model_runner import ModelRunner


@dataclass
class ShardCheckpoint:
    """One rank's slices of a checkpoint (what a worker the leader starts is handed for in-memory models)."""

    arch: ArchConfig
    weights: dict[str, torch.Tensor]


def cut_checkpoint(checkpoint, shard: Shard) -> ShardCheckpoint:
    """An in-memory checkpoint's slices for `shard`."""
    check_shardable(checkpoint.arch, shard.world_size)
    return ShardCheckpoint(checkpoint.arch, shard_weights(checkpoint.weights, checkpoint.arch, shard))


def read_shard(model: str, dtype: torch.dtype, shard: Shard):
    """(this rank's slices, the checkpoint they came from: tokenizer, path) of a registry name,
    a Hugging Face folder (read in slices) or a GGUF file (each tensor cut as it is read)."""
    from speculant.loader import load_checkpoint

    def checked_slice(name: str, arch: ArchConfig):
        check_shardable(arch, shard.world_size)
        return slice_of(name, arch, shard)

    checkpoint = load_checkpoint(model, dtype, slices=checked_slice)
    return ShardCheckpoint(checkpoint.arch, checkpoint.weights), checkpoint


def target_runner(part: ShardCheckpoint, model_config: ModelConfig, group: TPGroup) -> ModelRunner:
    """This rank's target runner over its slices."""
    device, dtype = torch.device(model_config.device), model_config.torch_dtype
    model = TensorParallelLlama(part.arch, group, device, dtype, model_config.weights)
    model.load_weights({name: w.to(device) for name, w in part.weights.items()})
    return ModelRunner(model, backend_for(model, model_config), device, dtype)


def head_runner(target: ModelRunner, head, model_config: ModelConfig) -> ModelRunner:
    """This rank's part of a draft head (`HeadCheckpoint`) over its target shard."""
    model = sharded_head(target.model, head, target.device, target.dtype, model_config.weights)
    return ModelRunner(model, backend_for(model, model_config), target.device, target.dtype)


def load_part(config: EngineConfig, shard: Shard, part: ShardCheckpoint | None) -> ShardCheckpoint:
    """This rank's slices: handed over (in-memory models), else read from the model's folder."""
    if part is not None:
        return part
    return read_shard(config.model.model, config.model.torch_dtype, shard)[0]
