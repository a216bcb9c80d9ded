"""The EAGLE-3 head's input from several target layers (Li et al. 2025, EAGLE-3, Sec. 3.2).

An `eagle3` head reads, in place of the target's last-layer state h_i, the target's residual
stream after three of its layers (`feature_layers`; by default (2, L // 2, L - 3) of an L-layer
target, as EAGLE-3 chooses low, middle and high layers): the target's forward exposes them
concatenated, [T, 3 * hidden] (`CausalLM.forward_features`). Each third is RMSNorm'd with its
own weight (`fnorm.{0,1,2}.weight`), the thirds are concatenated again and projected by
`fc.weight` [hidden, 3 * hidden] to [T, hidden]; that state goes where h_i goes in the normed
variant (hnorm, concat with enorm(embed), eh_proj, the layer, the final norm).

Which input gets the fusion is decided by width: a hidden input of 3 * hidden columns is the
target's features, one of hidden columns the head's own output (draft positions >= 2, and every
tree level past the first), which goes straight to hnorm. The widths never coincide.

The head also has its own lm_head (`lm_head.weight` [Nk, hidden] over its draft vocabulary, or
[vocab, hidden] without one), started from the target's rows and trained with the head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from speculant.config import ArchConfig
from speculant.layers.norm import rms_norm

FEATURE_VARIANT = "eagle3"  # the head variant that reads feature layers
NUM_FEATURE_LAYERS = 3
Product = Callable[[torch.Tensor], torch.Tensor]


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """(2, L // 2, L - 3) for an L-layer target, each brought into 0..L - 1 (tiny targets)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


def check_feature_layers(layers: Sequence[int], num_layers: int | None = None) -> tuple[int, ...]:
    """`layers` as a tuple, or a ValueError naming the field: three indices in 0..L - 1 (L:
    `num_layers`, the target's; None: checked when the target is known)."""
    layers = tuple(layers)
    if len(layers) != NUM_FEATURE_LAYERS:
        raise ValueError(f"feature_layers: an {FEATURE_VARIANT} head reads {NUM_FEATURE_LAYERS} target layers, got {list(layers)}")
    if any(not isinstance(i, int) or i < 0 for i in layers):
        raise ValueError(f"feature_layers: layer indices from 0, got {list(layers)}")
    if num_layers is not None and max(layers) >= num_layers:
        raise ValueError(f"feature_layers: the target has layers 0..{num_layers - 1}, got {list(layers)}")
    return layers


def parse_feature_layers(text: str) -> tuple[int, ...]:
    """`--feature-layers 2,15,27` -> (2, 15, 27); empty: the default for the target."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"feature_layers: comma-separated layer indices, got {text!r}") from None


def feature_weight_shapes(arch: ArchConfig, draft_vocab: int = 0) -> dict[str, tuple[int, ...]]:
    """The eagle3 head's tensors beyond the normed variant's; `draft_vocab` rows of its lm_head
    (0: the whole vocabulary)."""
    h = arch.hidden_size
    shapes: dict[str, tuple[int, ...]] = {f"fnorm.{i}.weight": (h,) for i in range(NUM_FEATURE_LAYERS)}
    return shapes | {"fc.weight": (h, NUM_FEATURE_LAYERS * h), "lm_head.weight": (draft_vocab or arch.vocab_size, h)}


@dataclass
class FeatureFusion:
    """fnorm per layer, concat, fc: the target's features [T, 3 * hidden] -> [T, hidden]."""

    norms: tuple[torch.Tensor, ...]  # NUM_FEATURE_LAYERS x [hidden]
    fc: Product  # [3 * hidden] -> [hidden]
    eps: float

    @property
    def width(self) -> int:  # the columns of the features it fuses
        return sum(n.shape[0] for n in self.norms)

    def __call__(self, features: torch.Tensor) -> torch.Tensor:  # [T, 3 * hidden] -> [T, hidden]
        parts = features.split([n.shape[0] for n in self.norms], dim=-1)
        normed = [rms_norm(x, w.to(x.dtype), self.eps) for x, w in zip(parts, self.norms)]
        return self.fc(torch.cat(normed, dim=-1))


def build_fusion(weights: dict[str, torch.Tensor], arch: ArchConfig, linear) -> FeatureFusion:
    """The fusion from an eagle3 head's named weights; `linear(weight, bias)` makes its product."""
    norms = tuple(weights[f"fnorm.{i}.weight"] for i in range(NUM_FEATURE_LAYERS))
    return FeatureFusion(norms, linear(weights["fc.weight"], None), arch.rms_norm_eps)


def fuse_if_features(fusion: FeatureFusion | None, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [T, 3 * hidden] (the target's features) fused to [T, hidden]; a [T, hidden] state
    (the head's own output) as it is."""
    if fusion is None or hidden.shape[-1] != fusion.width:
        return hidden
    return fusion(hidden)
