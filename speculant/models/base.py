"""The model interface every family implements, and the per-forward context it is handed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from speculant.attention.base import AttentionBackend
from speculant.config import ArchConfig


@dataclass(frozen=True)
class ForwardContext:
    """Everything one forward needs besides tokens and positions; passed explicitly, never global."""

    backend: AttentionBackend
    meta: Any  # what backend.plan returned for this forward
    k_cache: torch.Tensor  # [num_layers, num_slots, kv_heads, k_dim] (`CacheLayout`)
    v_cache: torch.Tensor  # [num_layers, num_slots, kv_heads, v_dim]; MLA: a view of k_cache
    window_meta: Any = None  # the plan of sliding-window layers (`ArchConfig.sliding_window`); None: `meta`


# A head's block: x [T, hidden], positions [T], the forward's context (the head's one cache layer)
HeadBlock = Callable[[torch.Tensor, torch.Tensor, ForwardContext], torch.Tensor]


class CausalLM(ABC):
    """A decoder over flat ragged batches: `forward` returns last-layer hidden states for every
    token (before the final norm, which EAGLE/MTP heads consume), `final_norm` applies the final
    norm alone, `compute_logits` turns selected rows into logits (final norm, then the LM head, then
    the family's logit soft-cap where it has one).

    `forward` reads token ids, or input embeddings in their place; `hidden_states` is an extra
    input for draft heads (a head fuses it with its embeddings); plain decoders refuse it."""

    arch: ArchConfig
    attention_backends: tuple[str, ...] | None = None  # the backends it runs on; None: any
    exposes_layers: bool = False  # whether `forward_features` runs (an eagle3 head can read it)

    def head_block(self, weights: dict[str, torch.Tensor]) -> HeadBlock | None:
        """The family's own decoder block built from a draft head's `layer.*` weights, for heads
        whose block is this family's layer (DeepSeek-V3's MTP module); None: a Llama block."""
        return None

    def own_head_weights(self) -> dict[str, torch.Tensor]:
        """The checkpoint's own MTP layer's tensors under their checkpoint names (DeepSeek-V3),
        for MTP speculation without a head folder (`speculant.loader.head_file.own_mtp_head`)."""
        raise ValueError(f"the {self.arch.family} checkpoint has no MTP layer of its own; pass head=PATH")

    @abstractmethod
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        ...

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor | None,  # [T]; None when input_embeds is given
        positions: torch.Tensor,  # [T]
        ctx: ForwardContext,
        input_embeds: torch.Tensor | None = None,  # [T, hidden] used instead of embed(input_ids)
        hidden_states: torch.Tensor | None = None,  # [T, hidden_in] extra input of draft heads
    ) -> torch.Tensor:  # [T, hidden] last layer output, before the final norm
        ...

    def forward_features(
        self,
        input_ids: torch.Tensor | None,  # [T]
        positions: torch.Tensor,  # [T]
        ctx: ForwardContext,
        layers: tuple[int, ...],  # the layers whose outputs are exposed, in this order
        input_embeds: torch.Tensor | None = None,  # [T, hidden]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [T, hidden] last layer output, [T, len(layers) * hidden]
        """`forward`, also exposing the residual stream after each of `layers` (an eagle3 head's
        input, `speculant.models.head_features`), concatenated in `layers`' order."""
        raise ValueError(f"feature_layers: the {self.arch.family} model exposes no layer outputs (eagle3 heads read Llama-family targets)")

    @abstractmethod
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, hidden]
        ...

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        ...
