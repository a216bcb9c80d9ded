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
    token (before the final norm, which EAGLE/MTP heads consume), `compute_logits` turns selected
    rows into logits."""

    arch: ArchConfig

    @abstractmethod
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        ...

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        ctx: ForwardContext,
    ) -> torch.Tensor:  # [T, hidden] last layer output, before the final norm
        ...

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        ...
