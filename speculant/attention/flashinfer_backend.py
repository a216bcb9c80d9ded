"""Paged attention through FlashInfer's batch wrappers (CUDA only, fp16/bf16).

Written against flashinfer-python 0.6-0.7 (plan/run signatures read from 0.6.0 and 0.7.4): the
eight core `plan` arguments go positionally, the rest by keywords that have kept their names
since 0.2. The paged cache is the engine's own, viewed in FlashInfer's NHD layout
`[num_pages, page_size, num_kv_heads, head_dim]`, so nothing is copied or converted.

`plan` turns the host-side ForwardBatch into FlashInfer's CSR page description (pure numpy,
unit-tested on the CPU) and plans one wrapper per forward: the decode wrapper when every
sequence brings one token and no tree mask, the prefill wrapper (causal, or with a custom
[q_len, kv_len] mask per sequence) otherwise. FlashInfer plans need the model's head counts and
dtype, which `configure` receives once from the model runner.

flashinfer itself is imported in the constructor, so this module (and its planning functions)
imports on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from speculant.attention.base import AttentionBackend
from speculant.attention.batch import ForwardBatch

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace
TENSOR_CORE_DECODE_GROUP = 4  # q heads per kv head from which tensor-core decode pays off


@dataclass(frozen=True)
class PagedKVLayout:
    """A ForwardBatch in FlashInfer's CSR page format, int32 on the host."""

    qo_indptr: np.ndarray  # [B + 1] query rows of sequence b: [qo_indptr[b], qo_indptr[b + 1])
    kv_indptr: (
        np.ndarray
    )  # [B + 1] pages of sequence b: kv_indices[kv_indptr[b] : kv_indptr[b + 1]]
    kv_indices: np.ndarray  # [total_pages] page ids, sequence by sequence, in KV order
    kv_last_page_len: np.ndarray  # [B] filled slots of each sequence's last page, 1..page_size


def paged_kv_layout(fb: ForwardBatch) -> PagedKVLayout:
    kv_lens = np.asarray(fb.kv_lens, dtype=np.int64)
    num_pages = -(-kv_lens // fb.page_size)  # [B]
    if (num_pages > fb.page_table.shape[1]).any():
        raise ValueError("a sequence's page_table row is shorter than its kv_len needs")
    kv_indptr = np.zeros(fb.num_seqs + 1, dtype=np.int32)
    np.cumsum(num_pages, out=kv_indptr[1:])
    used = np.arange(fb.page_table.shape[1])[None, :] < num_pages[:, None]  # [B, max_pages]
    return PagedKVLayout(
        qo_indptr=np.asarray(fb.cu_seqlens_q, dtype=np.int32),
        kv_indptr=kv_indptr,
        kv_indices=np.asarray(fb.page_table[used], dtype=np.int32),  # row-major keeps page order
        kv_last_page_len=(kv_lens - (num_pages - 1) * fb.page_size).astype(np.int32),
    )


def flashinfer_custom_mask(fb: ForwardBatch) -> np.ndarray:
    """[sum(q_len_b * kv_len_b)] bool, FlashInfer's flattened custom_mask: per sequence a
    row-major [q_len, kv_len] block whose cached-prefix columns are all visible and whose last
    w columns are the batch's [q_len, w] mask (the new tokens and the w - q_len keys before)."""
    blocks, offset = [], 0
    for q_len, kv_len, w in zip(fb.q_lens.tolist(), fb.kv_lens.tolist(), fb.mask_widths.tolist(), strict=True):
        block = np.ones((q_len, kv_len), dtype=bool)
        new = fb.custom_mask[offset : offset + q_len * w].reshape(q_len, w)
        block[:, kv_len - w :] = new != 0
        blocks.append(block.reshape(-1))
        offset += q_len * w
    return np.concatenate(blocks)


def uses_decode_kernel(fb: ForwardBatch) -> bool:
    return len(fb.custom_mask) == 0 and bool((fb.q_lens == 1).all())


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype


@dataclass
class FlashInferMeta:
    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    wrapper: Any  # the planned BatchDecode- or BatchPrefillWithPagedKVCacheWrapper
    page_size: int
    sm_scale: float  # softmax scale the wrapper is planned with
    plan_args: tuple = ()  # what `wrapper.plan` got, kept to re-plan for another scale
    plan_kwargs: dict = field(default_factory=dict)

    def replan(self, sm_scale: float) -> None:
        """FlashInfer fixes the softmax scale at plan time; a layer asking for another re-plans."""
        self.plan_kwargs["sm_scale"] = sm_scale
        self.wrapper.plan(*self.plan_args, **self.plan_kwargs)
        self.sm_scale = sm_scale


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, device: torch.device) -> None:
        try:
            import flashinfer
        except ImportError as err:
            raise ImportError(
                "attention_backend='flashinfer' needs flashinfer-python (pip install "
                "'speculant[gpu]'); use attention_backend='torch' without it"
            ) from err
        self.device = device
        self._flashinfer = flashinfer
        # One workspace per backend, shared by its two wrappers: a forward plans only one.
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode: Any = None
        self.shape: AttentionShape | None = None

    def configure(
        self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"FlashInfer attention runs in float16 or bfloat16, not {dtype}; "
                "choose one of those dtypes or attention_backend='torch'"
            )
        self.shape = AttentionShape(num_heads, num_kv_heads, head_dim, dtype)
        self.decode = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_tensor_cores=num_heads // num_kv_heads >= TENSOR_CORE_DECODE_GROUP,
        )

    def workspace_bytes(self, num_seqs: int, max_q: int, max_kv: int) -> int:
        return WORKSPACE_BYTES  # allocated once, whatever the batch

    def plan(self, fb: ForwardBatch, device: torch.device) -> FlashInferMeta:
        if self.shape is None:
            raise RuntimeError("FlashInferAttention.configure(...) must run before plan()")
        s, layout = self.shape, paged_kv_layout(fb)
        kwargs: dict[str, Any] = dict(
            pos_encoding_mode="NONE",
            sm_scale=s.head_dim**-0.5,
            q_data_type=s.dtype,
            kv_data_type=s.dtype,
        )
        arrays = [layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len]
        index_device = torch.device("cpu")  # FlashInfer schedules from host copies of the indptrs
        if uses_decode_kernel(fb):
            wrapper, arrays = self.decode, arrays[1:]
        elif len(fb.custom_mask) == 0:
            wrapper, kwargs["causal"] = self.prefill, True
        else:
            wrapper, index_device = self.prefill, device
            # 0.6 (unlike 0.7.4) packs the mask with indptrs left on qo_indptr's device, so they
            # must sit beside the mask; plan() takes the host copies it schedules from itself.
            kwargs["custom_mask"] = _to(flashinfer_custom_mask(fb), device)
        args = (
            *(_to(a, index_device) for a in arrays),
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
            fb.page_size,
        )
        wrapper.plan(*args, **kwargs)
        return FlashInferMeta(
            slot_mapping=_to(fb.slot_mapping, device),
            wrapper=wrapper,
            page_size=fb.page_size,
            sm_scale=kwargs["sm_scale"],
            plan_args=args,
            plan_kwargs=kwargs,
        )

    def forward(
        self, q, k, v, k_cache, v_cache, meta: FlashInferMeta, scale: float
    ) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        if scale != meta.sm_scale:
            meta.replan(scale)
        pages = (
            k_cache.view(-1, meta.page_size, *k_cache.shape[1:]),  # [num_pages, page_size, Hkv, D]
            v_cache.view(-1, meta.page_size, *v_cache.shape[1:]),
        )
        out = meta.wrapper.run(q.contiguous(), pages)  # [T, H, D]
        return out.reshape(q.shape[0], -1)


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)
