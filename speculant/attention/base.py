"""The attention backend interface: plan on the host before a forward, then attend per layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from speculant.attention.batch import ForwardBatch


class AttentionBackend(ABC):
    """Writes a layer's new K/V into its paged cache and attends over the sequence's pages.

    `configure` runs once, when a model runner takes the backend, with the model's attention
    shape; `plan` runs once per forward on the host (it may build masks, indptr arrays, kernel
    plans); `forward` runs once per layer with the object `plan` returned.
    """

    name: str = "abstract"

    def configure(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:  # noqa: B027
        """The model's head counts, head size and K/V dtype, for backends whose kernel plans need
        them before the first layer runs (FlashInfer); the default keeps nothing."""

    def workspace_bytes(self, num_seqs: int, max_q: int, max_kv: int) -> int:
        """Most bytes one forward allocates beyond its inputs, outputs and the K/V cache, for a
        batch of `num_seqs` sequences of at most `max_q` queries over at most `max_kv` keys
        (the engine's memory plan counts it); the default: none."""
        return 0

    @abstractmethod
    def plan(self, fb: ForwardBatch, device: torch.device) -> Any:
        """Per-forward metadata for `forward`, from the host-side batch description."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim] this layer's pages, flat
        v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
        meta: Any,
        scale: float,
    ) -> torch.Tensor:  # [T, num_heads * head_dim]
        """Store k/v at the batch's slots, then attend each query to its visible keys."""
