"""FlashInfer attention against the torch reference on the same inputs, on CUDA in fp16/bf16:
prefill from 0, a chunk after a cached prefix, decode (short and long, for split-KV), multi-token
verification, a draft tree, and mixes of them, with pages scattered over the cache, grouped-query
and plain heads, several page sizes; then a tiny model's logits through each backend.

The reference is the torch backend in float32 on the same (rounded) values, so the tolerances
measure FlashInfer's half-precision softmax and PV product alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from testkit import ancestor_mask

from speculant.attention.batch import SeqInput, build_forward_batch
from speculant.attention.torch_backend import TorchAttention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashInfer needs CUDA"),
]

HEAD_DIM, NUM_SLOTS = 128, 8192  # cache of NUM_SLOTS // page_size pages
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}  # atol = rtol, outputs are O(1)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@dataclass
class Case:
    kv_start: int  # tokens already in the cache
    q_len: int  # new tokens this forward
    tree_parents: list[int] | None = None  # parent of each new token (-1: the cached prefix)


MIXES = {
    "prefill_from_0": [Case(0, 37)],
    "chunk_after_prefix": [Case(45, 29)],
    "decode_batch": [Case(3, 1), Case(300, 1), Case(64, 1), Case(1000, 1)],  # long rows split KV
    "decode_one_token_prompt": [Case(0, 1), Case(0, 1)],
    "verification": [Case(100, 5), Case(7, 4)],
    "tree": [Case(50, 7, tree_parents=[-1, 0, 0, 1, 1, 2, 5])],
    "mixed": [
        Case(0, 19),  # prefill
        Case(33, 1),  # decode
        Case(21, 16),  # chunk continuing after a prefix
        Case(70, 4),  # verification of 3 drafts
        Case(17, 6, tree_parents=[-1, 0, 0, 1, 2, 2]),  # tree
        Case(0, 1),  # one-token prompt
    ],
}
DTYPES = [torch.float16, torch.bfloat16]
HEADS = [(8, 2), (4, 4)]  # (q heads, kv heads): GQA with tensor-core decode, and plain MHA


def _flashinfer(num_heads: int, num_kv_heads: int, dtype: torch.dtype):
    pytest.importorskip("flashinfer")
    from speculant.attention.flashinfer_backend import FlashInferAttention

    backend = FlashInferAttention(CUDA)
    backend.configure(num_heads, num_kv_heads, HEAD_DIM, dtype)
    return backend


def _inputs(
    cases: list[Case], heads: tuple[int, int], dtype: torch.dtype, page_size: int, seed: int = 0
):
    """Batch, caches holding each prefix (garbage elsewhere), and the new q/k/v, all in `dtype`."""
    num_heads, num_kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    free = list(np.random.default_rng(seed).permutation(NUM_SLOTS // page_size))  # scattered pages
    shape = (NUM_SLOTS // page_size * page_size, num_kv_heads, HEAD_DIM)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    seqs, qs, ks, vs = [], [], [], []
    for c in cases:
        length = c.kv_start + c.q_len
        table = [int(free.pop()) for _ in range(-(-length // page_size))]
        slots = [table[i // page_size] * page_size + i % page_size for i in range(length)]
        keys, values = (
            torch.randn(length, num_kv_heads, HEAD_DIM, generator=gen).to(dtype) for _ in range(2)
        )
        k_cache[slots[: c.kv_start]] = keys[: c.kv_start]  # what earlier forwards wrote
        v_cache[slots[: c.kv_start]] = values[: c.kv_start]
        tree = None if c.tree_parents is None else ancestor_mask(c.tree_parents)
        seqs.append(SeqInput([0] * c.q_len, c.kv_start, table, tree_mask=tree))
        qs.append(torch.randn(c.q_len, num_heads, HEAD_DIM, generator=gen).to(dtype))
        ks.append(keys[c.kv_start :])
        vs.append(values[c.kv_start :])
    fb = build_forward_batch(seqs, page_size)
    return fb, (k_cache, v_cache), (torch.cat(qs), torch.cat(ks), torch.cat(vs))


def _compare(cases, heads, dtype, page_size, scale=HEAD_DIM**-0.5) -> None:
    fb, caches, qkv = _inputs(cases, heads, dtype, page_size)
    reference_backend = TorchAttention(CPU)
    ref_caches = [c.float() for c in caches]
    expected = reference_backend.forward(
        *(x.float() for x in qkv), *ref_caches, reference_backend.plan(fb, CPU), scale
    )
    backend = _flashinfer(*heads, dtype)
    gpu_caches = [c.to(CUDA) for c in caches]
    out = backend.forward(*(x.to(CUDA) for x in qkv), *gpu_caches, backend.plan(fb, CUDA), scale)
    assert out.shape == expected.shape and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float().cpu(), expected, atol=tol, rtol=tol)
    for gpu_cache, ref_cache in zip(
        gpu_caches, ref_caches, strict=True
    ):  # same slots written, bit for bit
        assert torch.equal(gpu_cache.cpu().float(), ref_cache)


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(MIXES))
def test_matches_torch_reference(name: str, dtype: torch.dtype, heads: tuple[int, int]) -> None:
    _compare(MIXES[name], heads, dtype, page_size=16)


@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize("name", ["mixed", "decode_batch"])
def test_page_sizes(name: str, page_size: int) -> None:
    _compare(MIXES[name], (8, 2), torch.bfloat16, page_size)


@pytest.mark.parametrize("name", ["mixed", "decode_batch"])
def test_softmax_scale_other_than_planned(name: str) -> None:
    _compare(MIXES[name], (8, 2), torch.float16, 16, scale=0.05)


def test_tiny_model_logits_match_torch_backend() -> None:
    """Prefill two prompts, decode both, verify a tree on one: the runner wires configure/plan."""
    pytest.importorskip("flashinfer")
    from testkit import TinyCheckpoint, tiny_hf_model

    from speculant.config import ModelConfig
    from speculant.executor.executor import Executor
    from speculant.executor.loading import build_runner
    from speculant.executor.plan import TARGET, ForwardPlan

    hf = tiny_hf_model("llama", hidden_size=256, intermediate_size=256, num_attention_heads=4)
    steps = [
        [
            SeqInput(list(range(5, 25)), 0, [3, 7], logits="all"),
            SeqInput(list(range(40, 73)), 0, [10, 2, 5], logits="all"),
        ],
        [SeqInput([9], 20, [3, 7]), SeqInput([11], 33, [10, 2, 5])],
        [
            SeqInput(
                [4, 6, 8, 10],
                21,
                [3, 7],
                positions=[21, 22, 22, 23],
                logits="all",
                tree_mask=ancestor_mask([-1, 0, 0, 1]),
            )
        ],
    ]
    logits = {}
    for name in ("torch", "flashinfer"):
        config = ModelConfig(
            model="tiny", dtype="bfloat16", device=CUDA.type, attention_backend=name
        )
        executor = Executor(build_runner(TinyCheckpoint(hf), config))
        executor.allocate_kv(num_pages=16, page_size=16)
        logits[name] = [executor.run(ForwardPlan(TARGET, s)).logits.cpu() for s in steps]
    for fi, ref in zip(logits["flashinfer"], logits["torch"], strict=True):
        torch.testing.assert_close(fi, ref, atol=0.05 * float(ref.abs().max()), rtol=0.05)
