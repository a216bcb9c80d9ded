"""A model's K/V tensors over the engine's shared pages (slots flattened: page * page_size + i).

A model declares what one token keeps per layer (`CacheLayout`): per-head K and V (Llama), or
one latent row whose first columns double as the values (MLA: c_kv [kv_lora_rank] then the
shared RoPE key [qk_rope_head_dim]); the page byte budget follows the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from speculant.config import ArchConfig


@dataclass(frozen=True)
class CacheLayout:
    num_layers: int
    kv_heads: int
    k_dim: int  # K entry per head
    v_dim: int  # V entry per head
    values_in_keys: bool = False  # V is K's first v_dim columns (MLA's latent), stored once

    @classmethod
    def of(cls, arch: ArchConfig) -> CacheLayout:
        if arch.mla is not None:
            m = arch.mla
            return cls(arch.num_layers, 1, m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank, values_in_keys=True)
        return cls(arch.num_layers, arch.num_kv_heads, arch.head_dim, arch.head_dim)

    def bytes_per_token_per_layer(self, dtype: torch.dtype) -> int:
        per_head = self.k_dim + (0 if self.values_in_keys else self.v_dim)
        return self.kv_heads * per_head * dtype.itemsize


def kv_bytes_per_page(layout: CacheLayout, page_size: int, dtype: torch.dtype) -> int:
    return layout.num_layers * page_size * layout.bytes_per_token_per_layer(dtype)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor. On the CPU its memory comes from calloc, whose large blocks are the kernel's
    zero pages, committed only when first written: a K/V budget caps memory instead of taking it
    all at start-up (torch.zeros writes every byte). Aligned to 64 bytes for vector loads."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = dtype.itemsize * int(np.prod(shape))
    buf = np.zeros(nbytes + 64, dtype=np.uint8)
    start = -buf.ctypes.data % 64
    return torch.from_numpy(buf[start : start + nbytes]).view(dtype).view(shape)


class KVCache:
    def __init__(self, layout: CacheLayout, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device) -> None:
        slots = num_pages * page_size
        self.k = zeroed((layout.num_layers, slots, layout.kv_heads, layout.k_dim), dtype, device)  # [layers, slots, kv_heads, k_dim]
        if layout.values_in_keys:
            self.v = self.k[..., : layout.v_dim]  # a view: [layers, slots, kv_heads, v_dim]
        else:
            self.v = zeroed((layout.num_layers, slots, layout.kv_heads, layout.v_dim), dtype, device)
        self._storages = (self.k,) if layout.values_in_keys else (self.k, self.v)  # each buffer once
        self.page_size = page_size

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:  # [M] int64 each, on the cache's device
        """Copy the rows at `src_slots` to `dst_slots` (distinct), every layer, as if every source
        were read before any destination is written: sources and destinations may overlap (tree
        compaction moves a row onto a slot another row is read from). Each buffer is copied once,
        so V stored inside K (MLA) is not copied again from rows already moved."""
        for storage in self._storages:  # [layers, slots, kv_heads, dim]
            rows = storage.index_select(1, src_slots)  # a gathered copy: [layers, M, kv_heads, dim]
            storage.index_copy_(1, dst_slots, rows)

    def slots(self, page_table: list[int], length: int) -> list[int]:
        """Cache slots of a sequence's first `length` tokens (used by tests and debugging)."""
        p = self.page_size
        return [page_table[i // p] * p + i % p for i in range(length)]
