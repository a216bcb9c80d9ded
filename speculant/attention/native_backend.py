"""Row-invariant attention on the CPU: the native kernel reads each query's visible keys straight
from their cache slots (no gathered copy of the K/V, no padding, no SDPA), so a query attends
bit for bit alike in a one-token decode step, a (k+1)-token verification, a tree, a prefill
chunk or a batch of other sequences. The host plan gives each query token its sequence's slot
list and how many of those slots it may read; a tree adds a per-token mask over them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from speculant.attention.base import AttentionBackend
from speculant.attention.batch import ForwardBatch
from speculant.attention.torch_backend import build_mask
from speculant.kernels import native


@dataclass
class NativeAttentionMeta:
    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    slots: torch.Tensor  # [B, L] cache slot of each key position of each sequence (0 past its length)
    tok_seq: torch.Tensor  # [T] sequence of each query token
    tok_keys: torch.Tensor  # [T] key positions 0..n-1 of its sequence a query may read
    mask: torch.Tensor | None  # [T, L] bool: which of those it sees (trees); None: all of them


class NativeAttention(AttentionBackend):
    name = "native"

    def __init__(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise ValueError(f"the native attention backend runs on the CPU, not {device}")
        self.kernels = native.module()
        if self.kernels is None:
            raise RuntimeError("the native kernels are not built (see speculant.kernels.native); use attention_backend='torch'")
        self.device = device
        self.shape: tuple[int, int, int] = (1, 1, 1)  # heads, kv heads, head_dim

    def configure(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.shape = (num_heads, num_kv_heads, head_dim)

    def workspace_bytes(self, num_seqs: int, max_q: int, max_kv: int) -> int:
        """Per forward: the slot lists [B, L] int64, two int64 per token and a [T, L] tree mask;
        per layer: a float32 copy of the queries, the output, one score row per thread."""
        heads, _, head_dim = self.shape
        tokens = num_seqs * max_q
        plan = 8 * num_seqs * max_kv + 16 * tokens + tokens * max_kv
        layer = 2 * 4 * tokens * heads * head_dim + 4 * torch.get_num_threads() * max_kv
        return plan + layer

    def plan(self, fb: ForwardBatch, device: torch.device) -> NativeAttentionMeta:
        q_lens, kv_lens = fb.q_lens, fb.kv_lens
        max_kv = int(kv_lens.max())
        key_pos = np.arange(max_kv)
        pages = fb.page_table[:, np.minimum(key_pos // fb.page_size, fb.page_table.shape[1] - 1)]
        slots = np.where(key_pos < kv_lens[:, None], pages * fb.page_size + key_pos % fb.page_size, 0)
        tok_seq = np.repeat(np.arange(fb.num_seqs), q_lens)
        offset = np.arange(fb.num_tokens) - fb.cu_seqlens_q[tok_seq]
        mask = None
        if len(fb.custom_mask) or fb.sliding_window is not None:  # a tree or a window: every key up to the sequence's end, filtered by a mask
            tok_keys = kv_lens[tok_seq]
            mask = torch.from_numpy(build_mask(fb, int(q_lens.max()), max_kv)[tok_seq, offset])
        else:  # causal: the prefix and the new tokens up to itself
            tok_keys = (kv_lens - q_lens)[tok_seq] + offset + 1
        as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
        return NativeAttentionMeta(as_tensor(fb.slot_mapping), as_tensor(slots), as_tensor(tok_seq), as_tensor(tok_keys), mask)

    def forward(self, q, k, v, k_cache, v_cache, meta: NativeAttentionMeta, scale: float) -> torch.Tensor:
        if k.dtype != k_cache.dtype or k.stride(-1) != 1 or k.stride(-2) != k.shape[-1]:  # the kernel writes rows as they are
            k, v = k.to(k_cache.dtype).contiguous(), v.to(v_cache.dtype).contiguous()
        dtype, q = q.dtype, q.float()
        if q.stride(-1) != 1 or q.stride(-2) != q.shape[-1]:
            q = q.contiguous()
        out = self.kernels.paged_attention(
            q, k_cache, v_cache, meta.slots, meta.tok_seq, meta.tok_keys, meta.mask, k, v, meta.slot_mapping, scale, native.use_avx2()
        )  # [T, H * Dv] float32; the new tokens' keys and values are written into the caches first
        return out.to(dtype)
