"""A forward's batch description, built on the CPU as integer arrays and packed into one buffer.

Every model forward (target prefill, decode, verification, draft steps) runs over a flat ragged
batch: the new tokens of B sequences concatenated, `cu_seqlens_q` marking where each starts. KV
slot `i` of a sequence is `page_table[i // page_size] * page_size + i % page_size`; the new tokens
of sequence b occupy its slots [kv_start[b], kv_start[b] + q_len[b]). RoPE positions are separate
from slots so a tree can give siblings the same position. Everything is numpy int64 so that the
whole description packs into one buffer: one host-to-device copy, one broadcast to other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_FIELDS = (
    "input_ids",
    "positions",
    "slot_mapping",
    "cu_seqlens_q",
    "kv_lens",
    "page_table",
    "logits_indices",
    "custom_mask",
    "mask_widths",
)


@dataclass(frozen=True)
class SeqInput:
    """One sequence's part of a forward."""

    token_ids: list[int]  # new tokens, in KV-slot order
    kv_start: int  # slots already filled before these tokens
    page_table: list[int]
    positions: list[int] | None = None  # RoPE positions; None means kv_start + i
    logits: str = "last"  # "last" | "all" | "none": which new tokens get logits
    # [q_len, w] bool over the last w key slots (w >= q_len: the new tokens and the w - q_len
    # cached slots just before them, e.g. a head's earlier tree entries); row i may see key j.
    # Keys before those w are visible to every row. None: causal over the new tokens.
    tree_mask: np.ndarray | None = None


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64 cache slot each new token's K/V is written to
    cu_seqlens_q: np.ndarray  # [B + 1] int64
    kv_lens: np.ndarray  # [B] int64 KV length after this forward
    page_table: np.ndarray  # [B, max_pages] int64, padded with 0
    logits_indices: np.ndarray  # [N] int64 rows of the flat batch that get logits
    custom_mask: np.ndarray  # [sum(q_len_b * w_b)] int64 0/1 over each sequence's last w_b keys, empty if causal
    mask_widths: np.ndarray  # [B] int64 w_b (q_len_b where causal), empty if causal
    page_size: int
    # Sliding-window layers' plans only (host side, not packed): a query at position p sees the
    # keys at positions > p - sliding_window. None: every visible key.
    sliding_window: int | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.kv_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def q_lens(self) -> np.ndarray:  # [B]
        return np.diff(self.cu_seqlens_q)

    def pack(self) -> np.ndarray:
        """[header + data] int64: header = page_size, B, max_pages, then each field's length."""
        arrays = [getattr(self, name).reshape(-1) for name in _FIELDS]
        header = [self.page_size, self.num_seqs, self.page_table.shape[1]] + [len(a) for a in arrays]
        return np.concatenate([np.asarray(header, dtype=np.int64)] + arrays)

    @classmethod
    def unpack(cls, buf, header: np.ndarray | None = None) -> ForwardBatch:
        """Views into `buf` (numpy or a device tensor); sizes read from `header` (a host copy of
        the buffer's start) when given, so unpacking a device buffer needs no sync."""
        head = buf if header is None else header
        page_size, num_seqs, max_pages = (int(x) for x in head[:3])
        sizes = [int(x) for x in head[3 : 3 + len(_FIELDS)]]
        offset, parts = 3 + len(_FIELDS), {}
        for name, size in zip(_FIELDS, sizes):
            parts[name] = buf[offset : offset + size]
            offset += size
        parts["page_table"] = parts["page_table"].reshape(num_seqs, max_pages)
        return cls(page_size=page_size, **parts)


def build_forward_batch(seqs: list[SeqInput], page_size: int) -> ForwardBatch:
    q_lens = np.array([len(s.token_ids) for s in seqs], dtype=np.int64)
    kv_start = np.array([s.kv_start for s in seqs], dtype=np.int64)
    cu = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu[1:])
    max_pages = max(1, max(len(s.page_table) for s in seqs))
    table = np.zeros((len(seqs), max_pages), dtype=np.int64)
    for b, s in enumerate(seqs):
        table[b, : len(s.page_table)] = s.page_table
    seq_of_token = np.repeat(np.arange(len(seqs)), q_lens)  # [T]
    slot_idx = kv_start[seq_of_token] + (np.arange(cu[-1]) - cu[seq_of_token])  # [T]
    slots = table[seq_of_token, slot_idx // page_size] * page_size + slot_idx % page_size
    positions = np.concatenate([_positions(s) for s in seqs])
    return ForwardBatch(
        input_ids=np.concatenate([np.asarray(s.token_ids, dtype=np.int64) for s in seqs]),
        positions=positions,
        slot_mapping=slots,
        cu_seqlens_q=cu,
        kv_lens=kv_start + q_lens,
        page_table=table,
        logits_indices=np.concatenate([_logit_rows(s, int(cu[b])) for b, s in enumerate(seqs)]),
        custom_mask=_custom_mask(seqs),
        mask_widths=_mask_widths(seqs),
        page_size=page_size,
    )


def _positions(s: SeqInput) -> np.ndarray:
    if s.positions is not None:
        return np.asarray(s.positions, dtype=np.int64)
    return np.arange(s.kv_start, s.kv_start + len(s.token_ids), dtype=np.int64)


def _logit_rows(s: SeqInput, start: int) -> np.ndarray:
    n = len(s.token_ids)
    if s.logits == "all":
        return np.arange(start, start + n, dtype=np.int64)
    if s.logits == "last":
        return np.array([start + n - 1], dtype=np.int64)
    return np.zeros(0, dtype=np.int64)


def _custom_mask(seqs: list[SeqInput]) -> np.ndarray:
    if all(s.tree_mask is None for s in seqs):
        return np.zeros(0, dtype=np.int64)
    parts = []
    for s in seqs:
        n = len(s.token_ids)
        mask = s.tree_mask if s.tree_mask is not None else np.tri(n, dtype=bool)
        if mask.ndim != 2 or mask.shape[0] != n or not n <= mask.shape[1] <= s.kv_start + n:
            raise ValueError(f"tree_mask must be [q_len, w] with q_len <= w <= kv_start + q_len, got {mask.shape} for q_len {n}")
        parts.append(np.asarray(mask, dtype=np.int64).reshape(-1))
    return np.concatenate(parts)


def _mask_widths(seqs: list[SeqInput]) -> np.ndarray:
    if all(s.tree_mask is None for s in seqs):
        return np.zeros(0, dtype=np.int64)
    return np.array([len(s.token_ids) if s.tree_mask is None else s.tree_mask.shape[1] for s in seqs], dtype=np.int64)


__all__ = ["ForwardBatch", "SeqInput", "build_forward_batch"]
