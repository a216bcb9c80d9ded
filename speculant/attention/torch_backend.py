"""Reference attention in plain torch (CPU and GPU): gather each sequence's pages, pad, SDPA.

The plan gathers slot indices and builds one boolean mask per forward on the host, so each layer
does two gathers and one `scaled_dot_product_attention` call whatever the mix of prefill, decode,
verification or tree tokens in the batch. Padding every sequence to the longest query would make
a prefill chunk of C tokens cost every decoding sequence of the batch C query rows over its whole
context (and one sequence verifying k drafts cost every other k + 1), so a causal batch mixing
one-token queries, verification (at most `SHORT_Q` tokens) and prefill chunks runs one SDPA call
per kind. Query heads that share a key head are folded into that head's query rows for
verification queries (and always with one key head): CPU SDPA over [B, Hk, Q * G] rows took
0.56 ms where grouped-query SDPA over [B, H, Q] took 1.24 (batch 32, 2 queries, smollm2's 9/3
heads, 200 keys), a verify step's attention 2-3x a decode step's for one more row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from speculant.attention.base import AttentionBackend
from speculant.attention.batch import ForwardBatch


@dataclass
class TorchAttentionMeta:
    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    kv_gather: torch.Tensor  # [B, L] cache slot of each visible key position (0 where padded)
    mask: torch.Tensor | None  # [B, 1, Q, L] bool, True = attend; None when every key is visible
    q_scatter: torch.Tensor | None  # [T] row of each token in the padded [B * Q] layout; None if T == B * Q
    num_seqs: int
    max_q: int
    groups: list[QueryGroup] | None = None  # mixed short and long queries: one SDPA call per group
    folded_masks: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # heads per key head -> `_folded_mask`


@dataclass
class QueryGroup:
    seqs: torch.Tensor  # [b] the group's sequences
    tokens: torch.Tensor  # [t] their rows of the flat batch, in order
    max_kv: int  # keys the group's sequences see, at most
    meta: TorchAttentionMeta  # the group's mask and padding, as if it were the whole batch


SHORT_Q = 16  # queries of 2 to this many tokens (verification) form one group, longer ones another


class TorchAttention(AttentionBackend):
    name = "torch"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.shape: tuple[int, int, int, int] = (1, 1, 1, 4)  # heads, kv heads, head_dim, K/V element bytes

    def configure(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.shape = (num_heads, num_kv_heads, head_dim, dtype.itemsize)

    def workspace_bytes(self, num_seqs: int, max_q: int, max_kv: int) -> int:
        """Per layer: the gathered keys and values [B, L, Hkv, D], the padded queries, SDPA's
        output and its reshaped copy [B * Q, H, D]; per forward: the slot gather [B, L] int64 on
        the host and device, the bool mask [B, Q, L] and SDPA's float copy of it (with one shared
        key head, the mask repeated per head: [B, Q * H, L])."""
        heads, kv_heads, head_dim, elt = self.shape
        gathered = 2 * num_seqs * max_kv * kv_heads * head_dim * elt
        queries = 3 * num_seqs * max_q * heads * head_dim * elt
        mask_rows = num_seqs * max_q * (heads if kv_heads == 1 else 1)
        return gathered + queries + 2 * 8 * num_seqs * max_kv + 5 * mask_rows * max_kv

    def plan(self, fb: ForwardBatch, device: torch.device) -> TorchAttentionMeta:
        q_lens, kv_lens = fb.q_lens, fb.kv_lens
        num_seqs, max_q, max_kv = fb.num_seqs, int(q_lens.max()), int(kv_lens.max())
        key_pos = np.arange(max_kv)
        pages = fb.page_table[:, np.minimum(key_pos // fb.page_size, fb.page_table.shape[1] - 1)]
        kv_gather = np.where(key_pos < kv_lens[:, None], pages * fb.page_size + key_pos % fb.page_size, 0)
        groups = _groups(fb, kv_gather, device)
        return TorchAttentionMeta(
            slot_mapping=_as_tensor(device, fb.slot_mapping),
            kv_gather=_as_tensor(device, kv_gather),
            num_seqs=num_seqs,
            max_q=max_q,
            groups=groups,
            **({"mask": None, "q_scatter": None} if groups else _padding(fb, max_q, max_kv, device)),
        )

    def forward(self, q, k, v, k_cache, v_cache, meta: TorchAttentionMeta, scale: float) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        if meta.groups:  # each group gathers its own sequences' keys straight from the cache
            return _by_group(q, meta.groups, lambda g, q: attend_gathered(q, gather(k_cache, g.meta.kv_gather), gather(v_cache, g.meta.kv_gather), g.meta, scale))
        return attend_gathered(q, gather(k_cache, meta.kv_gather), gather(v_cache, meta.kv_gather), meta, scale)


def gather(cache: torch.Tensor, kv_gather: torch.Tensor) -> torch.Tensor:  # [S, ...], [B, L] -> [B, L, ...]
    """The cache rows of every visible key. `index_select` on the flat slots: indexing with the
    [B, L] tensor itself copied the same rows 6x slower alone on CPU (and ~20% slower in the
    engine at batch 32, where the rows come from memory)."""
    return cache.index_select(0, kv_gather.view(-1)).view(*kv_gather.shape, *cache.shape[1:])


def _by_group(q: torch.Tensor, groups: list[QueryGroup], attend) -> torch.Tensor:  # [T, H, D] -> [T, H * Dv]
    """`attend(group, its queries)` per query group, the rows put back in batch order."""
    out = None
    for g in groups:
        part = attend(g, q.index_select(0, g.tokens))
        out = part.new_empty(q.shape[0], part.shape[1]) if out is None else out
        out.index_copy_(0, g.tokens, part)
    return out


def attend_gathered(
    q: torch.Tensor,  # [T, H, D]
    keys: torch.Tensor,  # [B, L, Hk, D] each sequence's visible keys, padded to L (Hk divides H)
    values: torch.Tensor,  # [B, L, Hk, Dv]
    meta: TorchAttentionMeta,
    scale: float,
) -> torch.Tensor:  # [T, H * Dv]
    """Pad the flat queries to [B, Q], one SDPA call under the plan's mask, unpad (per query
    group when the plan has groups)."""
    _, num_heads, head_dim = q.shape
    if meta.groups:
        return _by_group(q, meta.groups, lambda g, q: attend_gathered(q, keys[g.seqs, : g.max_kv], values[g.seqs, : g.max_kv], g.meta, scale))
    if meta.q_scatter is not None:
        padded = q.new_zeros(meta.num_seqs * meta.max_q, num_heads, head_dim)
        q = padded.index_copy_(0, meta.q_scatter, q)
    batch, max_q, kv_heads = meta.num_seqs, meta.max_q, keys.shape[2]
    if kv_heads < num_heads and (kv_heads == 1 or 1 < max_q <= SHORT_Q):  # heads sharing a key head become
        group = num_heads // kv_heads  # its query rows (q, g): no K/V copies, and a short verify is one
        queries = q.view(batch, max_q, kv_heads, group, head_dim).transpose(1, 2).reshape(batch, kv_heads, max_q * group, head_dim)
        out = F.scaled_dot_product_attention(queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=_folded_mask(meta, group), scale=scale)
        out = out.view(batch, kv_heads, max_q, group, -1).transpose(1, 2).reshape(batch * max_q, -1)  # [B * Q, H * Dv]
    else:
        queries = q.view(batch, max_q, num_heads, head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=meta.mask, scale=scale, enable_gqa=True
        )  # [B, H, Q, Dv]
        out = out.transpose(1, 2).reshape(batch * max_q, -1)
    return out if meta.q_scatter is None else out.index_select(0, meta.q_scatter)


def _folded_mask(meta: TorchAttentionMeta, group: int) -> torch.Tensor | None:
    """[B, 1, Q * group, L]: the plan's mask for query rows (q, g), built once per forward."""
    if meta.mask is None:
        return None
    if group not in meta.folded_masks:
        meta.folded_masks[group] = meta.mask.repeat_interleave(group, dim=2)
    return meta.folded_masks[group]


def _as_tensor(device: torch.device, a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _padding(fb: ForwardBatch, max_q: int, max_kv: int, device: torch.device) -> dict:
    """The mask ([B, 1, Q, L] or None) and the padded row of each token (None if unpadded)."""
    num_seqs, q_lens = fb.num_seqs, fb.q_lens
    q_scatter = None
    if fb.num_tokens != num_seqs * max_q:
        seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
        q_scatter = seq_of_token * max_q + np.arange(fb.num_tokens) - fb.cu_seqlens_q[seq_of_token]
    mask = build_mask(fb, max_q, max_kv)
    return {"mask": None if mask is None else _as_tensor(device, mask[:, None]), "q_scatter": None if q_scatter is None else _as_tensor(device, q_scatter)}


def _groups(fb: ForwardBatch, kv_gather: np.ndarray, device: torch.device) -> list[QueryGroup] | None:
    """Sequences by query length (one token, up to `SHORT_Q`, longer), for a causal batch
    holding more than one kind (else None): one verifying sequence does not pad every decoding
    one to its length, nor a prefill chunk every verifying one."""
    q_lens = fb.q_lens
    bucket = np.where(q_lens == 1, 0, np.where(q_lens <= SHORT_Q, 1, 2))
    kinds = np.unique(bucket)
    if len(fb.custom_mask) or len(kinds) == 1:
        return None
    groups = []
    for kind in kinds:
        seqs = np.flatnonzero(bucket == kind)
        sub_q, sub_kv = q_lens[seqs], fb.kv_lens[seqs]
        starts = fb.cu_seqlens_q[seqs]
        tokens = np.concatenate([np.arange(a, a + n) for a, n in zip(starts, sub_q)])
        cu = np.concatenate([[0], np.cumsum(sub_q)])
        sub = dataclasses.replace(fb, cu_seqlens_q=cu, kv_lens=sub_kv, input_ids=fb.input_ids[tokens], positions=fb.positions[tokens])
        max_q, max_kv = int(sub_q.max()), int(sub_kv.max())
        gathered = _as_tensor(device, kv_gather[seqs, :max_kv])
        meta = TorchAttentionMeta(None, gathered, num_seqs=len(seqs), max_q=max_q, **_padding(sub, max_q, max_kv, device))
        groups.append(QueryGroup(_as_tensor(device, seqs), _as_tensor(device, tokens), max_kv, meta))
    return groups


def build_mask(fb: ForwardBatch, max_q: int, max_kv: int) -> np.ndarray | None:
    """[B, Q, L] bool: a query sees the prefix, then new tokens causally (or by the tree mask)."""
    q_lens, kv_lens = fb.q_lens, fb.kv_lens
    kv_start = kv_lens - q_lens
    no_tree = len(fb.custom_mask) == 0
    if no_tree and max_q == 1 and (kv_lens == max_kv).all() and fb.sliding_window is None:
        return None
    qi = np.arange(max_q)[None, :, None]
    kj = np.arange(max_kv)[None, None, :]
    mask = kj <= kv_start[:, None, None] + qi
    if not no_tree:
        _apply_tree_masks(mask, fb, kv_start)
    mask &= kj < kv_lens[:, None, None]
    if fb.sliding_window is not None:  # key j sits at position j (the prefix; tree keys are the newest)
        mask &= kj > _query_positions(fb, max_q)[:, :, None] - fb.sliding_window
    mask |= (qi >= q_lens[:, None, None]) & (kj == 0)  # padded query rows: one key, no NaN
    return mask


def _query_positions(fb: ForwardBatch, max_q: int) -> np.ndarray:  # [B, Q] (0 where padded)
    seq = np.repeat(np.arange(fb.num_seqs), fb.q_lens)
    positions = np.zeros((fb.num_seqs, max_q), dtype=np.int64)
    positions[seq, np.arange(fb.num_tokens) - fb.cu_seqlens_q[seq]] = fb.positions
    return positions


def _apply_tree_masks(mask: np.ndarray, fb: ForwardBatch, kv_start: np.ndarray) -> None:
    """Each sequence's [q_len, w] mask over its last w keys (the new tokens and w - q_len before)."""
    offset = 0
    for b, (n, w) in enumerate(zip(fb.q_lens.tolist(), fb.mask_widths.tolist())):
        tree = fb.custom_mask[offset : offset + n * w].reshape(n, w).astype(bool)
        end = int(kv_start[b]) + n
        mask[b, :n, end - w : end] = tree
        offset += n * w
