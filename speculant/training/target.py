"""What head training takes from the target: its frozen embedding and lm_head (the checkpoint's own
tensors), its architecture, its identity (name + sha256) recorded in the head file, and on request
one of its decoder layers as the head block's starting weights (`--init-layer`); a trained head's
weights as another run's start (`--init-head`)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

import torch

from speculant.config import ArchConfig
from speculant.loader.head_file import (
    HeadCheckpoint,
    HeadFileConfig,
    checkpoint_sha256,
    load_head,
    save_head,
)
from speculant.models.head import head_arch, head_weight_shapes


@dataclass(frozen=True)
class TargetTensors:
    name: str  # registry name or path, as given
    sha256: str
    arch: ArchConfig
    embed: torch.Tensor  # [vocab, H] requires_grad False
    lm_head: torch.Tensor  # [vocab, H] the embedding itself when tied
    weights: Any = None  # the checkpoint's tensors by Hugging Face name (for `layer`)

    def layer(self, index: int) -> dict[str, torch.Tensor]:
        """The target's decoder layer `index` in fp32 under the head's names (`layer.*`):
        a starting point for the head's block (`--init-layer`)."""
        if not 0 <= index < self.arch.num_layers:
            raise ValueError(f"init_layer: the target has layers 0..{self.arch.num_layers - 1}, got {index}")
        if self.arch.mla is not None:
            raise ValueError("init_layer: a DeepSeek-V3 target's MTP block is not shaped like its layers; start it from its own MTP weights")
        prefix = f"model.layers.{index}."
        names = [k for k in head_weight_shapes(head_arch(self.arch), "eagle") if k.startswith("layer.")]
        return {name: _dense(self.weights, prefix + name.removeprefix("layer.")) for name in names}


def target_tensors(checkpoint, name: str) -> TargetTensors:
    """The checkpoint's embedding and lm_head in float32 (the same tensors when already fp32)."""
    sha256 = checkpoint_sha256(checkpoint)
    weights = checkpoint.weights
    embed = _dense(weights, "model.embed_tokens.weight")
    tied = checkpoint.arch.tie_word_embeddings or "lm_head.weight" not in weights
    lm_head = embed if tied else _dense(weights, "lm_head.weight")
    return TargetTensors(name, sha256, checkpoint.arch, embed, lm_head, weights)


def _dense(weights: dict, name: str) -> torch.Tensor:
    tensor = weights[name]
    if not isinstance(tensor, torch.Tensor):
        tensor = tensor.dequantize()
    return tensor.detach().float().requires_grad_(False)


def save_trained_head(
    folder: pathlib.Path, model, target: TargetTensors, variant: str, training: dict[str, Any], feature_layers: tuple[int, ...] = (),
    dtype: torch.dtype = torch.float32,
) -> pathlib.Path:
    """`model` (a HeadObjective) as a head file for `target`, its tensors in `dtype` (a head is
    cast to its target's dtype when loaded); `training` says how it was made; `feature_layers`:
    the target layers an eagle3 head reads."""
    weights = {k: v.detach().to(dtype) for k, v in model.head_weights().items()}
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
        feature_layers=feature_layers,
    )
    return save_head(folder, weights, config)


def start_head(path: str, target: TargetTensors, draft_vocab: int) -> tuple[HeadCheckpoint, torch.Tensor | None]:
    """The trained head in `path` that a run starts from (`--init-head`), and its draft vocabulary
    ([Nk] int64 sorted ids, or None: the whole vocabulary), which the run keeps (its data may have
    grown since, which would count another one): the head must be trained for this target and its
    vocabulary hold `draft_vocab` tokens (0: the whole vocabulary)."""
    head = load_head(path, expect_sha256=target.sha256)
    stored = head.weights.get("vocab_map")
    size = 0 if stored is None else stored.numel()
    if size != draft_vocab:
        raise ValueError(f"draft_vocab: init_head {path} holds a draft vocabulary of {size} tokens (0: the whole vocabulary); this run asks for {draft_vocab}")
    return head, None if stored is None else stored.long()


def trained_start(head: HeadCheckpoint, fresh: dict[str, torch.Tensor], kind: tuple[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The start head's weights (see `start_head`) as fp32 in place of `fresh`: it must be of this
    run's (variant, feature layers) `kind` and hold the same tensors, shaped alike; otherwise an
    error naming what differs."""
    where = f"init_head: {head.path}"
    if (head.config.variant, head.config.feature_layers) != kind:
        raise ValueError(f"{where} is a {head.config.variant} head over layers {list(head.config.feature_layers)}; this run trains {kind[0]} over {list(kind[1])}")
    saved = {k: v for k, v in head.weights.items() if k != "vocab_map"}
    differ = sorted(k for k in saved.keys() | fresh.keys() if k not in saved or k not in fresh or saved[k].shape != fresh[k].shape)
    if differ:
        raise ValueError(f"{where}: tensors {differ} are missing or shaped unlike this run's head")
    return {k: v.float() for k, v in saved.items()}
