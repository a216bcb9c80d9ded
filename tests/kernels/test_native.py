"""The native CPU kernels against plain torch references, on each vector path this CPU runs: the
product of every weight layout, attention over paged K/V with and without a tree mask, and the
property they exist for: a row's output does not depend on the other rows of the call."""

from __future__ import annotations

import pytest
import torch

from speculant.kernels import native
from speculant.layers import packing
from speculant.layers.quant import quantize_int4, quantize_int8
from speculant.utils import cpu

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)")


def _paths() -> list:
    avx2 = pytest.param(True, id="avx2", marks=pytest.mark.skipif(not cpu.has_avx2(), reason="needs AVX2, FMA and F16C"))
    return [avx2, pytest.param(False, id="scalar")]


AVX512 = pytest.mark.skipif(not cpu.has_avx512(), reason="needs AVX-512 F, VL and BW (utils.cpu)")


def _int4(w):
    g = quantize_int4(w)
    args = (*packing.pack_int4(g), w.shape[0])
    return lambda x, simd: native.module().int4_linear(x, *args, int(simd)), g.dequantize()


def _int8(w):
    g = quantize_int8(w)
    args = (*packing.pack_int8(g), w.shape[0])
    return lambda x, simd: native.module().int8_linear(x, *args, int(simd)), g.dequantize()


def _dense(dtype):
    def make(w):
        wd = w.to(dtype).contiguous()
        return lambda x, avx2: native.module().dense_linear(x, wd, None, avx2), wd.float()

    return make


def _quantized_rows(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x rounded as the kernels round activations per 32-value block: int8 rows' products take
    int16 (scale amax / 32767); int4 groups' take int8 (amax / 127), plus a second int8 level
    (a 254th of the first's step) for what it rounded off where max|x| > 4 rms(x)."""
    blocks = x.view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    step = amax / (127 if layout == "int4" else 32767)
    rounded = torch.round(blocks / torch.where(step > 0, step, 1)) * step
    if layout == "int4":
        wide = amax.square() > 16 * blocks.square().mean(-1, keepdim=True)
        rest, fine = blocks - rounded, step / 254
        rounded = rounded + wide * torch.round(rest / torch.where(fine > 0, fine, 1)) * fine
    return rounded.view_as(x)


_LAYOUTS = {"int4": _int4, "int8": _int8, "f32": _dense(torch.float32), "bf16": _dense(torch.bfloat16)}


@pytest.mark.parametrize("avx2", _paths())
@pytest.mark.parametrize("out", [80, 84])  # 84: the last group of 8 weight rows is padded
@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_products_equal_the_reference_and_are_row_invariant(layout, out, avx2):
    _check_product(layout, out, avx2)


@AVX512
@pytest.mark.parametrize("out", [80, 84])
@pytest.mark.parametrize("layout", ["int4", "int8"])
def test_quantized_products_on_the_avx512_path_are_row_invariant(layout, out):
    _check_product(layout, out, 2)  # tiles of 8 rows: 17 rows are 8 + 8 + 1


def _check_product(layout, out, path):
    """`path`: the dense products' avx2 flag, or the quantized products' simd (0, 1, 2; a bool as 0/1)."""
    torch.manual_seed(0)
    product, weight = _LAYOUTS[layout](torch.randn(out, 96 + 32))
    x = torch.randn(40, 128)
    x[::3, 37] = 40.0  # an outlier channel: int4's activation blocks there take the second level
    full = product(x, path)
    assert full.dtype == torch.float32 and full.shape == (40, out)
    rows = _quantized_rows(x, layout) if layout.startswith("int") else x
    torch.testing.assert_close(full, rows.double().mm(weight.double().t()).float(), rtol=1e-4, atol=1e-3)
    for n in (1, 2, 5, 17):
        assert torch.equal(product(x[:n].contiguous(), path), full[:n])
    assert all(torch.equal(product(x[i : i + 1].contiguous(), path), full[i : i + 1]) for i in range(40))


@pytest.mark.skipif(not cpu.has_avx2(), reason="needs AVX2, FMA and F16C")
@pytest.mark.parametrize("layout", ["int4", "int8"])
def test_quantized_products_are_the_same_on_both_vector_paths(layout):
    torch.manual_seed(2)
    product, _ = _LAYOUTS[layout](torch.randn(48, 256))
    x = torch.randn(7, 256) * torch.logspace(-3, 3, 256)  # outlier channels: large integer dots
    assert torch.equal(product(x, True), product(x, False))


@AVX512
@pytest.mark.parametrize("layout", ["int4", "int8"])
def test_quantized_products_are_the_same_on_every_path(layout):
    torch.manual_seed(3)
    product, _ = _LAYOUTS[layout](torch.randn(48, 256))
    x = torch.randn(19, 256) * torch.logspace(-3, 3, 256)
    wide = product(x, 2)
    assert torch.equal(wide, product(x, 1)) and torch.equal(wide, product(x, 0))


def test_dense_bias_and_bad_shapes():
    w, b, x = torch.randn(16, 64), torch.randn(16), torch.randn(3, 64)
    out = native.module().dense_linear(x, w, b, False)
    torch.testing.assert_close(out, x @ w.t() + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="w must be"):
        native.module().dense_linear(x, torch.randn(16, 32), None, False)


def _attention_reference(q, kc, vc, slots, tok_seq, tok_keys, mask, scale):  # [T, H * Dv]
    out = []
    group = q.shape[1] // kc.shape[1]
    for t in range(q.shape[0]):
        keys = slots[tok_seq[t], : tok_keys[t]]
        seen = torch.ones(len(keys), dtype=torch.bool) if mask is None else mask[t, : tok_keys[t]]
        k = kc[keys].float().repeat_interleave(group, 1)  # [n, H, D]
        v = vc[keys].float().repeat_interleave(group, 1)
        s = torch.einsum("hd,nhd->hn", q[t].double(), k.double()) * scale
        s = s.masked_fill(~seen[None], float("-inf"))
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v.double()).reshape(-1))
    return torch.stack(out).float()


@pytest.mark.parametrize("avx2", _paths())
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tree", [False, True])
def test_attention_equals_softmax_and_each_query_reads_only_its_keys(avx2, cache_dtype, tree):
    torch.manual_seed(1)
    heads, kv_heads, d, num_slots = 6, 2, 40, 64
    kc, vc = (torch.randn(num_slots, kv_heads, d).to(cache_dtype) for _ in range(2))
    slots = torch.stack([torch.randperm(num_slots)[:20], torch.randperm(num_slots)[:20]])  # [2, 20]
    tok_seq = torch.tensor([0, 0, 0, 1, 1])
    tok_keys = torch.tensor([9, 10, 11, 20, 3])
    mask = None
    if tree:
        mask = torch.rand(5, 20) > 0.3
        mask[torch.arange(5), tok_keys - 1] = True  # every query sees itself
    q = torch.randn(5, heads, d)
    out = native.module().paged_attention(q, kc, vc, slots, tok_seq, tok_keys, mask, None, None, None, 0.2, avx2)
    reference = _attention_reference(q, kc, vc, slots, tok_seq, tok_keys, mask, 0.2)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    for t in range(5):  # alone, with padding keys the others left in `slots`
        alone = native.module().paged_attention(
            q[t : t + 1].contiguous(), kc, vc, slots[tok_seq[t] : tok_seq[t] + 1], torch.tensor([0]), tok_keys[t : t + 1],
            None if mask is None else mask[t : t + 1].contiguous(), None, None, None, 0.2, avx2
        )
        assert torch.equal(alone, out[t : t + 1])


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_a_tree_row_attends_as_the_chain_row_over_the_same_keys_and_both_paths_agree(cache_dtype):
    """A tree's mask drops keys before any arithmetic: the row of a node attends bit for bit as the
    same token on the accepted chain, whose slot list holds just its ancestors; and the AVX2 path
    gives the scalar path's bits (exp, lane sums and dot products in the same order)."""
    torch.manual_seed(3)
    kv_heads, d, n = 2, 72, 37  # a head size past a multiple of 8, keys past a multiple of 8
    kc, vc = (torch.randn(64, kv_heads, d).to(cache_dtype) for _ in range(2))
    q = torch.randn(1, 6, d) * 3
    tree_slots = torch.randperm(64)[:n][None]
    seen = torch.rand(1, n) > 0.4
    seen[0, -1] = True
    chain_slots = tree_slots[seen][None]
    args = dict(tree=(tree_slots, torch.tensor([n]), seen), chain=(chain_slots, torch.tensor([int(seen.sum())]), None))
    paths = [False] + ([True] if cpu.has_avx2() else [])
    outs = [
        native.module().paged_attention(q, kc, vc, slots, torch.tensor([0]), keys, mask, None, None, None, 0.125, avx2)
        for slots, keys, mask in args.values()
        for avx2 in paths
    ]
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


@pytest.mark.skipif(not cpu.has_avx2(), reason="needs AVX2, FMA and F16C")
@pytest.mark.parametrize("tree", [False, True])
def test_a_long_verification_attends_as_each_row_alone_on_both_paths(tree):
    """20 rows of one sequence (the AVX2 path's runs of 16 rows, its value sums 12 (row, head)
    pairs at a time) and a one-row sequence beside them: every row equals itself alone, and the
    AVX2 path gives the scalar path's bits."""
    torch.manual_seed(4)
    kc, vc = torch.randn(96, 2, 24), torch.randn(96, 2, 24)
    slots = torch.stack([torch.randperm(96)[:60], torch.randperm(96)[:60]])
    tok_seq = torch.tensor([0] * 20 + [1])
    tok_keys = torch.cat([torch.arange(41, 61), torch.tensor([33])])
    mask = None
    if tree:
        mask = torch.rand(21, 60) > 0.3
        mask[torch.arange(21), tok_keys - 1] = True
    q = torch.randn(21, 6, 24)
    run = lambda rows, avx2: native.module().paged_attention(  # noqa: E731
        q[rows].contiguous(), kc, vc, slots, tok_seq[rows].contiguous(), tok_keys[rows].contiguous(),
        None if mask is None else mask[rows].contiguous(), None, None, None, 0.2, avx2)
    everything = run(slice(None), True)
    assert torch.equal(everything, run(slice(None), False))
    assert all(torch.equal(run(slice(t, t + 1), True), everything[t : t + 1]) for t in range(21))


def test_attention_writes_the_new_keys_and_values_and_reads_strided_queries():
    torch.manual_seed(5)
    kc, vc = torch.randn(32, 2, 16), torch.randn(32, 2, 16)
    qkv = torch.randn(3, (4 + 2 + 2) * 16)  # one fused row per token: 4 query heads, then k, then v
    q, k, v = (qkv[:, a * 16 : b * 16].view(3, -1, 16) for a, b in ((0, 4), (4, 6), (6, 8)))
    slots, tok_seq, tok_keys = torch.arange(32)[None], torch.zeros(3, dtype=torch.long), torch.tensor([9, 10, 11])
    new = torch.tensor([8, 9, 10])
    expected_k, expected_v = kc.index_copy(0, new, k), vc.index_copy(0, new, v)
    expected = native.module().paged_attention(q.contiguous(), expected_k, expected_v, slots, tok_seq, tok_keys, None, None, None, None, 0.3, False)
    out = native.module().paged_attention(q, kc, vc, slots, tok_seq, tok_keys, None, k, v, new, 0.3, False)
    assert torch.equal(kc, expected_k) and torch.equal(vc, expected_v) and torch.equal(out, expected)
    with pytest.raises(RuntimeError, match="outside the cache"):
        native.module().paged_attention(q, kc, vc, slots, tok_seq, tok_keys, None, k, v, torch.tensor([8, 9, 99]), 0.3, False)


def test_the_cpu_cap_picks_the_scalar_path(monkeypatch):
    monkeypatch.setenv("SPECULANT_CPU_LEVEL", "scalar")
    assert not native.use_avx2() and cpu.features() == frozenset()
    monkeypatch.setenv("SPECULANT_CPU_LEVEL", "avx2")
    assert not cpu.has("avx512f") and not cpu.has_native_bf16()
    monkeypatch.setenv("SPECULANT_CPU_LEVEL", "avx9")
    with pytest.raises(ValueError, match="SPECULANT_CPU_LEVEL"):
        cpu.features()


@pytest.mark.parametrize("avx2", _paths())
def test_norms_equal_torch_and_are_row_invariant(avx2):
    torch.manual_seed(3)
    x, r, w = torch.randn(9, 100) * 3, torch.randn(9, 100), torch.rand(100) + 0.5  # 100: a tail after 8-lane chunks
    out = native.module().rms_norm(x, w, 1e-6, avx2)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (100,), w, 1e-6), rtol=1e-5, atol=1e-5)
    total, normed = native.module().add_rms_norm(x, r, w, 1e-6, avx2)
    assert torch.equal(total, x + r) and torch.equal(normed, native.module().rms_norm(x + r, w, 1e-6, avx2))
    for i in range(9):
        assert torch.equal(native.module().rms_norm(x[i : i + 1].contiguous(), w, 1e-6, avx2), out[i : i + 1])
    if cpu.has_avx2():
        assert torch.equal(out, native.module().rms_norm(x, w, 1e-6, not avx2))


def test_rotary_in_place_equals_the_torch_rotation():
    from speculant.layers.rotary import apply_rotary

    torch.manual_seed(4)
    x, cos, sin = torch.randn(5, 7 * 16), torch.randn(5, 16), torch.randn(5, 16)
    expected = apply_rotary(x[:, : 5 * 16].reshape(5, 5, 16), cos[:, None], sin[:, None])
    native.module().rotary_(x, cos, sin, 5, 16)
    assert torch.equal(x[:, : 5 * 16].reshape(5, 5, 16), expected)


@pytest.mark.parametrize("avx2", _paths())
@pytest.mark.parametrize("width", [1, 7, 8, 31, 32, 33, 100, 49152])
def test_argmax_rows_is_torch_argmax_with_ties_infinities_and_nans(avx2, width):
    torch.manual_seed(width)
    rows = [
        torch.randn(width),
        torch.randint(-2, 2, (width,)).float(),  # ties: the first maximum
        torch.full((width,), float("-inf")),
        torch.randn(width).clamp(max=0.0).abs().neg(),  # -0.0 and +0.0 tie
        torch.where(torch.rand(width) < 0.3, float("inf"), torch.randn(width)),
    ]
    with_nan = torch.randn(width)
    with_nan[width // 2] = with_nan[-1] = float("nan")  # a NaN is above every number, the first one wins
    x = torch.stack([*rows, with_nan])
    assert torch.equal(native.module().argmax_rows(x, avx2), x.argmax(-1))
