"""Runs one model over a ForwardBatch with its own K/V tensors in the engine's shared pages."""

from __future__ import annotations

import dataclasses

import torch

from speculant.attention.base import AttentionBackend
from speculant.attention.batch import ForwardBatch
from speculant.config import ArchConfig
from speculant.kv_cache.cache import CacheLayout, KVCache, kv_bytes_per_page
from speculant.models.base import CausalLM, ForwardContext


class ModelRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.backend, self.device, self.dtype = model, backend, device, dtype
        self.kv: KVCache | None = None
        self.layout = CacheLayout.of(model.arch)  # what a token keeps per layer (per-head K/V, or MLA's latent)
        backend.configure(model.arch.num_heads, self.layout.kv_heads, self.layout.k_dim, dtype)

    @property
    def arch(self) -> ArchConfig:
        return self.model.arch

    def kv_bytes_per_page(self, page_size: int) -> int:
        return kv_bytes_per_page(self.layout, page_size, self.dtype)

    def allocate_kv(self, num_pages: int, page_size: int) -> None:
        self.kv = KVCache(self.layout, num_pages, page_size, self.dtype, self.device)

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        input_embeds: torch.Tensor | None = None,  # [T, hidden] read instead of fb's token ids
        hidden_states: torch.Tensor | None = None,  # [T, hidden_in] extra input of draft heads
        input_ids: torch.Tensor | None = None,  # [T] device token ids read instead of fb's
        logits_rows: torch.Tensor | None = None,  # [N] device rows that get logits, instead of fb's
        feature_layers: tuple[int, ...] = (),  # layers whose outputs replace the last layer's as `hidden`
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [N, vocab] float32 for logits_rows (default fb.logits_indices), hidden [T, hidden]
        for every token (with `feature_layers`: [T, len(feature_layers) * hidden], those layers'
        outputs, `CausalLM.forward_features`).
        Called by the executor only (`executor/executor.py`)."""
        assert self.kv is not None, "allocate_kv first"
        if input_embeds is not None and input_embeds.shape[0] != fb.num_tokens:
            raise ValueError(f"input_embeds has {input_embeds.shape[0]} rows, the batch {fb.num_tokens} tokens")
        host = fb.pack()
        packed = torch.from_numpy(host).to(self.device, non_blocking=True)  # one copy
        view = ForwardBatch.unpack(packed, header=host)
        meta = self.backend.plan(fb, self.device)
        ctx = ForwardContext(self.backend, meta, self.kv.k, self.kv.v, self._window_plan(fb))
        if input_ids is None and input_embeds is None:
            input_ids = view.input_ids
        if feature_layers:
            hidden, features = self.model.forward_features(input_ids, view.positions, ctx, feature_layers, input_embeds)
        else:
            hidden = features = self.model.forward(input_ids, view.positions, ctx, input_embeds, hidden_states)
        rows = view.logits_indices if logits_rows is None else logits_rows
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return logits, features

    def _window_plan(self, fb: ForwardBatch):
        """The sliding-window layers' plan, when the model has them and a key falls outside a window."""
        arch = self.model.arch
        if not arch.sliding_layers or arch.sliding_window is None or int(fb.kv_lens.max()) <= arch.sliding_window:
            return None
        return self.backend.plan(dataclasses.replace(fb, sliding_window=arch.sliding_window), self.device)
