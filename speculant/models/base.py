"""The model interface every family implements, and the per-forward context it is handed."""

from __future__ import annotations

from abc import ABC, abstractmethod
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
    k_cache: torch.Tensor  # [num_layers, num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor  # [num_layers, num_slots, num_kv_heads, head_dim]


class CausalLM(ABC):
    """A decoder over flat ragged batches: `forward` returns last-layer hidden states for every
    token (before the final norm, which EAGLE/MTP heads consume), `final_norm` applies the final
    norm alone, `compute_logits` turns selected rows into logits (final norm, then the LM head).

    `forward` reads token ids, or input embeddings in their place; `hidden_states` is an extra
    input for draft heads (a head fuses it with its embeddings); plain decoders refuse it."""

    arch: ArchConfig

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

    @abstractmethod
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, hidden]
        ...

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        ...
