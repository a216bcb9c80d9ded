"""What head training takes from the target: its frozen embedding and lm_head (the checkpoint's own
tensors), its architecture, and its identity (name + sha256) recorded in the head file."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

import torch

from speculant.config import ArchConfig
from speculant.loader.head_file import HeadFileConfig, checkpoint_sha256, save_head


@dataclass(frozen=True)
class TargetTensors:
    name: str  # registry name or path, as given
    sha256: str
    arch: ArchConfig
    embed: torch.Tensor  # [vocab, H] requires_grad False
    lm_head: torch.Tensor  # [vocab, H] the embedding itself when tied


def target_tensors(checkpoint, name: str) -> TargetTensors:
    """The checkpoint's embedding and lm_head in float32 (the same tensors when already fp32)."""
    sha256 = checkpoint_sha256(checkpoint)
    weights = checkpoint.weights
    embed = _dense(weights, "model.embed_tokens.weight")
    tied = checkpoint.arch.tie_word_embeddings or "lm_head.weight" not in weights
    lm_head = embed if tied else _dense(weights, "lm_head.weight")
    return TargetTensors(name, sha256, checkpoint.arch, embed, lm_head)


def _dense(weights: dict, name: str) -> torch.Tensor:
    tensor = weights[name]
    if not isinstance(tensor, torch.Tensor):
        tensor = tensor.dequantize()
    return tensor.detach().float().requires_grad_(False)


def save_trained_head(folder: pathlib.Path, model, target: TargetTensors, variant: str, training: dict[str, Any]) -> pathlib.Path:
    """`model` (a HeadObjective) as a head file for `target`; `training` says how it was made."""
    weights = {k: v.detach().clone() for k, v in model.head_weights().items()}
    vocab_map = model.vocab_map
    if vocab_map is not None:
        weights["vocab_map"] = vocab_map
    config = HeadFileConfig(
        variant=variant,
        target=target.name,
        target_sha256=target.sha256,
        hidden_size=target.arch.hidden_size,
        draft_vocab_size=0 if vocab_map is None else int(vocab_map.numel()),
        training=training,
    )
    return save_head(folder, weights, config)
