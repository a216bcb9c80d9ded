"""Multi-head latent attention (DeepSeek-V2 sec. 2.1) over the compressed paged cache.

Per token and layer the cache holds one row [kv_lora_rank + qk_rope_head_dim]: the normed latent
c_kv, then the shared RoPE key. Head h's key is [W_UK[h] c_kv, k_rope] and its value W_UV[h] c_kv
(W_UK, W_UV: the two halves of `kv_b_proj`). Two equal ways to attend:

- absorbed (decode, verification, trees): W_UK folds into the query, q_h' = [q_nope_h W_UK[h],
  q_rope_h], which scores the cached row as it is (one shared key "head", dimension R + r); the
  attention output over the cached latents [R] becomes the value after it, through W_UV[h]. Only
  the latent is read, through the attention backend (its K is the cache row, its V a view of the
  row's first R columns);
- expanded (long prefill chunks): the sequences' latents are gathered and expanded into per-head
  keys and values, which costs fewer operations when queries are as many as keys.

Both keep the backend's mask semantics (prefix, then causal or a tree's mask over new tokens).
"""

from __future__ import annotations

from typing import Any

import torch

from speculant.attention.base import AttentionBackend
from speculant.attention.torch_backend import TorchAttentionMeta, attend_gathered, gather

# A forward whose longest sequence has this many new tokens expands: with DeepSeek-V3's dims
# (16 heads shown, R 512, r 64, dn = dv = 128) over 1,024 keys the two paths cost the same near
# 128 queries on this CPU's torch backend (absorbed 456 ms, expanded 445 ms per layer call).
EXPAND_MIN_QUERIES = 128


def mla_attend(
    q_nope: torch.Tensor,  # [T, H, dn]
    q_rope: torch.Tensor,  # [T, H, r] rotated
    latent: torch.Tensor,  # [T, R + r] new rows: normed c_kv, rotated shared key
    w_uk: torch.Tensor,  # [H, dn, R]
    w_uv: torch.Tensor,  # [H, dv, R]
    cache: torch.Tensor,  # [num_slots, 1, R + r] this layer's latent rows
    backend: AttentionBackend,
    meta: Any,
    scale: float,
    expand_min_queries: int = EXPAND_MIN_QUERIES,
) -> torch.Tensor:  # [T, H * dv]
    expand = isinstance(meta, TorchAttentionMeta) and meta.max_q >= expand_min_queries
    if expand:
        return _expanded(q_nope, q_rope, latent, w_uk, w_uv, cache, meta, scale)
    return _absorbed(q_nope, q_rope, latent, w_uk, w_uv, cache, backend, meta, scale)


def _absorbed(q_nope, q_rope, latent, w_uk, w_uv, cache, backend, meta, scale) -> torch.Tensor:
    rank = w_uk.shape[-1]
    q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, R]
    q = torch.cat([q_latent, q_rope], dim=-1)  # [T, H, R + r]
    row = latent[:, None]  # [T, 1, R + r]
    out = backend.forward(q, row, row[..., :rank], cache, cache[..., :rank], meta, scale)  # [T, H * R]
    out = out.view(q.shape[0], -1, rank).transpose(0, 1)  # [H, T, R]
    return torch.bmm(out, w_uv.transpose(1, 2)).transpose(0, 1).reshape(q.shape[0], -1)  # [T, H * dv]


def _expanded(q_nope, q_rope, latent, w_uk, w_uv, cache, meta: TorchAttentionMeta, scale) -> torch.Tensor:
    rank, heads = w_uk.shape[-1], w_uk.shape[0]
    cache.index_copy_(0, meta.slot_mapping, latent[:, None])
    rows = gather(cache, meta.kv_gather)[:, :, 0]  # [B, L, R + r]
    c_kv, k_rope = rows[..., :rank], rows[..., rank:]
    k_nope = torch.einsum("blr,hdr->blhd", c_kv, w_uk)  # [B, L, H, dn]
    values = torch.einsum("blr,hvr->blhv", c_kv, w_uv)  # [B, L, H, dv]
    keys = torch.cat([k_nope, k_rope[:, :, None].expand(-1, -1, heads, -1)], dim=-1)  # [B, L, H, dn + r]
    return attend_gathered(torch.cat([q_nope, q_rope], dim=-1), keys, values, meta, scale)
