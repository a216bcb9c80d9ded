"""Runs one model over a ForwardBatch with its own K/V tensors in the engine's shared pages."""

from __future__ import annotations

import torch

from speculant.attention.base import AttentionBackend
from speculant.attention.batch import ForwardBatch
from speculant.config import ArchConfig
from speculant.kv_cache.cache import KVCache, kv_bytes_per_page
from speculant.models.base import CausalLM, ForwardContext


class ModelRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.backend, self.device, self.dtype = model, backend, device, dtype
        self.kv: KVCache | None = None
        arch = model.arch
        backend.configure(arch.num_heads, arch.num_kv_heads, arch.head_dim, dtype)

    @property
    def arch(self) -> ArchConfig:
        return self.model.arch

    def kv_bytes_per_page(self, page_size: int) -> int:
        return kv_bytes_per_page(self.arch, page_size, self.dtype)

    def allocate_kv(self, num_pages: int, page_size: int) -> None:
        self.kv = KVCache(self.arch, num_pages, page_size, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [N, vocab] float32 for fb.logits_indices, hidden [T, hidden] for every token."""
        assert self.kv is not None, "allocate_kv first"
        host = fb.pack()
        packed = torch.from_numpy(host).to(self.device, non_blocking=True)  # one copy
        view = ForwardBatch.unpack(packed, header=host)
        meta = self.backend.plan(fb, self.device)
        ctx = ForwardContext(self.backend, meta, self.kv.k, self.kv.v)
        hidden = self.model.forward(view.input_ids, view.positions, ctx)
        logits = self.model.compute_logits(hidden.index_select(0, view.logits_indices))
        return logits, hidden
