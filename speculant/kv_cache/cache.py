"""A model's K/V tensors over the engine's shared pages (slots flattened: page * page_size + i)."""

from __future__ import annotations

import torch

from speculant.config import ArchConfig


def kv_bytes_per_page(arch: ArchConfig, page_size: int, dtype: torch.dtype) -> int:
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * arch.num_layers * page_size * arch.num_kv_heads * arch.head_dim * element


class KVCache:
    def __init__(self, arch: ArchConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (arch.num_layers, num_pages * page_size, arch.num_kv_heads, arch.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [layers, slots, kv_heads, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size

    def slots(self, page_table: list[int], length: int) -> list[int]:
        """Cache slots of a sequence's first `length` tokens (used by tests and debugging)."""
        p = self.page_size
        return [page_table[i // p] * p + i % p for i in range(length)]
