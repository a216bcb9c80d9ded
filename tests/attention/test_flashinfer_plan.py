"""The FlashInfer backend's host-side planning (pure numpy, runs on the CPU without FlashInfer):
CSR page layout, the [q_len, kv_len] custom mask, the kernel choice, checked by hand and against
the torch backend's gather slots and masks; plus import safety and the runner's configure call."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speculant.attention.batch import SeqInput, build_forward_batch
from speculant.attention.flashinfer_backend import (
    flashinfer_custom_mask,
    paged_kv_layout,
    uses_decode_kernel,
)
from speculant.attention.torch_backend import TorchAttention, build_mask
from speculant.executor.model_runner import ModelRunner

TREE = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)  # root, then two siblings


def test_layout_by_hand() -> None:
    fb = build_forward_batch(
        [
            SeqInput([1] * 7, 0, [9, 3]),  # prefill: 7 slots over 2 pages, 3 in the last
            SeqInput([1], 3, [5]),  # decode filling its page exactly
            SeqInput([1, 1], 8, [7, 0, 12]),  # chunk after a prefix; page 0 is a real page here
        ],
        page_size=4,
    )
    layout = paged_kv_layout(fb)
    assert fb.page_table.tolist() == [[9, 3, 0], [5, 0, 0], [7, 0, 12]]  # rows padded with 0
    assert layout.qo_indptr.tolist() == [0, 7, 8, 10]
    assert layout.kv_indptr.tolist() == [0, 2, 3, 6]
    assert layout.kv_indices.tolist() == [9, 3, 5, 7, 0, 12]
    assert layout.kv_last_page_len.tolist() == [3, 4, 2]
    for a in (layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len):
        assert a.dtype == np.int32


def test_custom_mask_by_hand() -> None:
    fb = build_forward_batch(
        [SeqInput([1, 1, 1], 2, [4, 6], tree_mask=TREE), SeqInput([1, 1], 1, [8])], page_size=3
    )
    tree_block = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]  # prefix of 2, then TREE
    causal_block = [[1, 1, 0], [1, 1, 1]]  # prefix of 1, then causal new tokens
    expected = np.concatenate(
        [np.array(tree_block).reshape(-1), np.array(causal_block).reshape(-1)]
    )
    mask = flashinfer_custom_mask(fb)
    assert mask.dtype == bool and mask.astype(int).tolist() == expected.tolist()


def test_kernel_choice() -> None:
    decode = [SeqInput([1], 5, [0, 1]), SeqInput([2], 0, [2])]
    assert uses_decode_kernel(build_forward_batch(decode, 4))
    assert not uses_decode_kernel(build_forward_batch(decode + [SeqInput([1, 2], 3, [3])], 4))
    one_node_tree = [SeqInput([1], 5, [0, 1], tree_mask=np.ones((1, 1), dtype=bool))]
    assert not uses_decode_kernel(build_forward_batch(one_node_tree, 4))


def test_a_page_table_too_short_is_refused() -> None:
    fb = build_forward_batch([SeqInput([1, 2], 3, [4, 6])], page_size=4)  # 5 slots need 2 pages
    with pytest.raises(ValueError, match="page_table"):
        paged_kv_layout(dataclasses.replace(fb, page_table=fb.page_table[:, :1]))


@st.composite
def batches(draw, trees: bool):
    page_size = draw(st.integers(1, 6))
    seqs = []
    for _ in range(draw(st.integers(1, 5))):
        kv_start, q_len = draw(st.integers(0, 20)), draw(st.integers(1, 6))
        num_pages = -(-(kv_start + q_len) // page_size)
        pages = draw(
            st.lists(st.integers(0, 99), min_size=num_pages, max_size=num_pages, unique=True)
        )
        tree = None
        if trees and draw(st.booleans()):
            tree = np.eye(q_len, dtype=bool)
            for i in range(1, q_len):
                tree[i] |= tree[draw(st.integers(0, i - 1))]
            extra = draw(st.integers(0, min(kv_start, 4)))  # cached slots the mask covers too (a head's tree entries)
            cached = np.array(draw(st.lists(st.booleans(), min_size=q_len * extra, max_size=q_len * extra)), dtype=bool)
            tree = np.concatenate([cached.reshape(q_len, extra), tree], 1)
        seqs.append(SeqInput([0] * q_len, kv_start, pages, tree_mask=tree))
    return build_forward_batch(seqs, page_size)


@settings(max_examples=150, deadline=None)
@given(batches(trees=False))
def test_layout_names_the_slots_the_torch_backend_gathers(fb) -> None:
    layout = paged_kv_layout(fb)
    meta = TorchAttention(torch.device("cpu")).plan(fb, torch.device("cpu"))
    for b, kv_len in enumerate(fb.kv_lens.tolist()):
        pages = layout.kv_indices[layout.kv_indptr[b] : layout.kv_indptr[b + 1]]
        slots = (pages[:, None] * fb.page_size + np.arange(fb.page_size)).reshape(-1)
        used = len(slots) - fb.page_size + layout.kv_last_page_len[b]
        assert 1 <= layout.kv_last_page_len[b] <= fb.page_size and used == kv_len
        assert slots[:used].tolist() == meta.kv_gather[b, :kv_len].tolist()


@settings(max_examples=150, deadline=None)
@given(batches(trees=True))
def test_custom_mask_matches_the_torch_backend_mask(fb) -> None:
    if len(fb.custom_mask) == 0:
        return  # no tree drawn: FlashInfer runs causal, no mask to compare
    mask = flashinfer_custom_mask(fb)
    reference = build_mask(fb, int(fb.q_lens.max()), int(fb.kv_lens.max()))  # [B, Q, L]
    offset = 0
    for b, (q_len, kv_len) in enumerate(zip(fb.q_lens.tolist(), fb.kv_lens.tolist(), strict=True)):
        block = mask[offset : offset + q_len * kv_len].reshape(q_len, kv_len)
        assert (block == reference[b, :q_len, :kv_len]).all()
        offset += q_len * kv_len
    assert offset == len(mask)


def test_importing_never_imports_flashinfer() -> None:
    code = (
        "import sys, speculant, speculant.attention.registry, speculant.attention.flashinfer_backend; "
        "sys.exit('flashinfer' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed"
)
def test_backend_without_flashinfer_says_what_to_install() -> None:
    from speculant.attention.registry import create_backend

    with pytest.raises(ImportError, match="flashinfer-python"):
        create_backend("flashinfer", torch.device("cpu"))


class RecordingBackend(TorchAttention):
    def configure(self, num_heads, num_kv_heads, head_dim, dtype) -> None:
        self.configured = (num_heads, num_kv_heads, head_dim, dtype)


def test_model_runner_configures_its_backend() -> None:
    model = SimpleNamespace(arch=SimpleNamespace(num_heads=6, num_kv_heads=2, head_dim=8, num_layers=1, mla=None))
    backend = RecordingBackend(torch.device("cpu"))
    ModelRunner(model, backend, torch.device("cpu"), torch.bfloat16)
    assert backend.configured == (6, 2, 8, torch.bfloat16)


class FakeWrapper:
    """FlashInfer's documented plan/run contract in plain torch: CSR pages in NHD layout, the
    causal mask aligned to the last key, a flattened [q_len, kv_len] custom mask per sequence."""

    def __init__(
        self, workspace: torch.Tensor, kv_layout: str, use_tensor_cores: bool = False
    ) -> None:
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.decode = False

    def plan(
        self,
        *args,
        custom_mask=None,
        causal=False,
        sm_scale=None,
        q_data_type=None,
        kv_data_type=None,
        pos_encoding_mode="NONE",
    ) -> None:
        if self.decode:
            kv_indptr, kv_indices, last_len, *shape = args
            qo_indptr = torch.arange(len(kv_indptr), dtype=torch.int32)
        else:
            qo_indptr, kv_indptr, kv_indices, last_len, *shape = args
        num_heads, num_kv_heads, head_dim, page_size = shape
        for t in (qo_indptr, kv_indptr, kv_indices, last_len):
            assert t.dtype == torch.int32
        assert ((last_len >= 1) & (last_len <= page_size)).all() and pos_encoding_mode == "NONE"
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1] - 1) * page_size + last_len
        q_lens = qo_indptr[1:] - qo_indptr[:-1]
        if custom_mask is not None:
            assert custom_mask.dtype == torch.bool and len(custom_mask) == int(
                (q_lens * kv_lens).sum()
            )
        self.args = [t.cpu().long() for t in (qo_indptr, kv_indptr, kv_indices, kv_lens)]
        self.custom_mask = None if custom_mask is None else custom_mask.cpu()
        self.causal, self.sm_scale, self.dtype = causal, sm_scale, q_data_type
        assert kv_data_type == q_data_type

    def run(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert q.dtype == self.dtype and q.is_contiguous()
        qo_indptr, kv_indptr, kv_indices, kv_lens = self.args
        out, mask_offset = torch.empty_like(q), 0
        for b in range(len(kv_lens)):
            q_b = q[qo_indptr[b] : qo_indptr[b + 1]].float()  # [n, H, D]
            n, kv_len, pages = (
                len(q_b),
                int(kv_lens[b]),
                kv_indices[kv_indptr[b] : kv_indptr[b + 1]],
            )
            k, v = (c[pages].flatten(0, 1)[:kv_len].float() for c in paged_kv)  # [L, Hkv, D]
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            visible = torch.ones(n, kv_len, dtype=torch.bool)
            if self.custom_mask is not None:
                visible = self.custom_mask[mask_offset : mask_offset + n * kv_len].view(n, kv_len)
                mask_offset += n * kv_len
            elif self.causal:
                visible = torch.arange(kv_len)[None, :] <= torch.arange(n)[:, None] + kv_len - n
            scores = torch.einsum("nhd,lhd->hnl", q_b, k) * self.sm_scale
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out[qo_indptr[b] : qo_indptr[b + 1]] = torch.einsum("hnl,lhd->nhd", probs, v).to(
                q.dtype
            )
        return out


class FakeDecodeWrapper(FakeWrapper):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.decode = True


FAKE_MIXES = {
    "prefill": [SeqInput([0] * 7, 0, [5, 9])],
    "decode": [SeqInput([0], 3, [4]), SeqInput([0], 11, [8, 1, 2])],
    "mixed": [
        SeqInput([0] * 9, 0, [0, 6, 13]),
        SeqInput([0], 8, [3, 11, 12]),
        SeqInput([0] * 4, 13, [7, 10, 14, 15, 16]),
        SeqInput([0] * 3, 4, [17, 18], tree_mask=TREE),
    ],
}


@pytest.mark.parametrize("scale", [8**-0.5, 0.3])
@pytest.mark.parametrize("name", list(FAKE_MIXES))
def test_backend_wiring_against_a_fake_flashinfer(monkeypatch, name: str, scale: float) -> None:
    """The backend's plan arguments, cache views and output layout, through a stand-in that
    follows FlashInfer's documented semantics, equal the torch backend on the same inputs."""
    monkeypatch.setitem(
        sys.modules,
        "flashinfer",
        SimpleNamespace(
            BatchPrefillWithPagedKVCacheWrapper=FakeWrapper,
            BatchDecodeWithPagedKVCacheWrapper=FakeDecodeWrapper,
        ),
    )
    from speculant.attention.flashinfer_backend import FlashInferAttention

    cpu, page_size, gen = torch.device("cpu"), 4, torch.Generator().manual_seed(0)
    fb = build_forward_batch(FAKE_MIXES[name], page_size)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16)  # noqa: E731
    caches = [randn(20 * page_size, 2, 8) for _ in range(2)]
    q, k, v = randn(fb.num_tokens, 6, 8), randn(fb.num_tokens, 2, 8), randn(fb.num_tokens, 2, 8)
    backend = FlashInferAttention(cpu)
    backend.configure(6, 2, 8, torch.bfloat16)
    meta = backend.plan(fb, cpu)
    assert (meta.wrapper is backend.decode) == (name == "decode")
    out = backend.forward(q, k, v, *caches, meta, scale)
    reference = TorchAttention(cpu)
    ref_caches = [c.float() for c in caches]
    expected = reference.forward(
        q.float(), k.float(), v.float(), *ref_caches, reference.plan(fb, cpu), scale
    )
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    assert all(torch.equal(c.float(), r) for c, r in zip(caches, ref_caches, strict=True))
