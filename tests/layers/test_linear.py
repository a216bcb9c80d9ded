"""Linear layers: every dense kernel computes F.linear; quantized layers are row-invariant."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from speculant.kernels import native
from speculant.layers import autotune
from speculant.layers.linear import DenseLinear, Int4Linear, Int8Linear, linear, make_linear
from speculant.layers.quant import Int4Groups, Int8Rows, cat_rows, quantize_int4, quantize_int8

ROWS = [1, 2, 5, 16, 17, 70]


@pytest.mark.parametrize("kernel", autotune.available())
@pytest.mark.parametrize("rows", ROWS)
def test_dense_kernels_compute_f_linear(kernel, rows):
    w, b, x = torch.randn(96, 64), torch.randn(96), torch.randn(rows, 64)
    packed = autotune.pack(w, {"1": kernel})
    for bias in (None, b):
        out = autotune.run(kernel, x, w, packed, bias)
        assert out.shape == (rows, 96) and out.is_contiguous()
        torch.testing.assert_close(out, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)


def test_dense_linear_uses_the_forced_kernel_per_bucket(monkeypatch):
    monkeypatch.setenv("SPECULANT_LINEAR_KERNEL", "onednn")
    layer = DenseLinear(torch.randn(32, 64))
    assert set(layer.kernels.values()) == {"onednn"} and layer.packed is not None
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("SPECULANT_LINEAR_KERNEL", "nope")
    with pytest.raises(ValueError, match="SPECULANT_LINEAR_KERNEL"):
        DenseLinear(torch.randn(32, 64))


@pytest.mark.skipif("onednn" not in autotune.available(), reason="no oneDNN in this PyTorch")
def test_a_layer_weight_is_let_go_when_only_the_packed_copy_runs(monkeypatch):
    w, b = torch.randn(32, 64), torch.randn(32)
    monkeypatch.setenv("SPECULANT_LINEAR_KERNEL", "onednn")
    layer, kept = DenseLinear(w.clone(), b, keep_weight=False), DenseLinear(w.clone(), b)
    assert layer.weight is None and kept.weight is not None  # e.g. an lm_head that is the embedding
    assert layer.shape == (32, 64) and layer.dtype == torch.float32
    for rows in ROWS:
        x = torch.randn(rows, 64)
        torch.testing.assert_close(layer(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("SPECULANT_LINEAR_KERNEL", "rowsplit")  # some bucket needs the weight: kept
    assert DenseLinear(w, b, keep_weight=False).weight is w


def test_measured_choices_are_cached_per_shape(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECULANT_LINEAR_KERNEL", raising=False)
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memo", {})
    monkeypatch.setattr(autotune, "_MIN_TUNED_BYTES", 0)
    calls = []
    monkeypatch.setattr(autotune, "measure", lambda w: calls.append(w.shape) or dict.fromkeys(autotune.BUCKETS, "mm"))
    w = torch.randn(48, 32)
    assert autotune.kernels_for(w) == dict.fromkeys(autotune.BUCKETS, "mm")
    autotune.kernels_for(w)
    assert calls == [w.shape]  # measured once
    saved = json.loads((tmp_path / "linear_kernels.json").read_text())
    assert [k.split("|")[-1] for k in saved] == ["48x32"]
    key = next(iter(saved))
    (tmp_path / "linear_kernels.json").write_text(json.dumps({key: {"1": "mm", "2-16": "mm"}}))
    monkeypatch.setattr(autotune, "_memo", {})
    autotune.kernels_for(w)
    assert calls == [w.shape, w.shape]  # choices made under other buckets are measured again


def test_measure_picks_a_kernel_per_bucket():
    choice = autotune.measure(torch.randn(64, 32), ["mm", "rowsplit"])
    assert set(choice) == set(autotune.BUCKETS) and set(choice.values()) <= {"mm", "rowsplit"}


def test_buckets():
    rows = (1, 2, 4, 5, 16, 17, 64, 65)
    assert [autotune.bucket(r) for r in rows] == ["1", "2-4", "2-4", "5-16", "5-16", "17-64", "17-64", "prefill"]


@pytest.mark.parametrize("kernel", ["mm", "rowsplit", "linear", "onednn", "widen"])
def test_bf16_kernels_compute_the_bf16_product(kernel, monkeypatch):
    """Every kernel a bf16 weight may get, "widen" included, through the layer object."""
    if kernel == "onednn" and not autotune.onednn_runs(torch.bfloat16):
        pytest.skip("oneDNN's bf16 products need AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT (utils.cpu)")
    monkeypatch.setenv("SPECULANT_LINEAR_KERNEL", kernel)
    w, b = torch.randn(96, 64), torch.randn(96)  # an fp32 bias, as a checkpoint's qkv bias
    layer = make_linear(w, b, "bf16", torch.float32)
    w, b = w.bfloat16(), b.bfloat16()
    assert set(layer.kernels.values()) == {kernel}
    for rows in ROWS:
        x = torch.randn(rows, 64)
        out = layer(x)
        reference = F.linear(x, w.float(), b.float())
        assert out.dtype == torch.float32 and out.shape == (rows, 96)
        assert (out - reference).abs().max() <= 0.02 * reference.abs().max()


def test_half_precision_weights_may_be_widened_and_fp32_ones_not():
    assert "widen" in autotune.available(torch.bfloat16) and "widen" not in autotune.available()
    choice = autotune.measure(torch.randn(64, 32).bfloat16(), ["mm", "widen"])
    assert set(choice) == set(autotune.BUCKETS) and set(choice.values()) <= {"mm", "widen"}


def test_bf16_dense_weight_with_fp32_activations():
    w, x = torch.randn(32, 64), torch.randn(3, 64)
    layer = make_linear(w, None, "bf16", torch.float32)
    assert layer.weight.dtype == torch.bfloat16
    reference = F.linear(x, w.bfloat16().float())  # activations and output rounded to bf16 too
    assert (layer(x) - reference).abs().max() <= 0.02 * reference.abs().max()


@pytest.mark.parametrize("rows", [1, 3])
def test_plain_function_equals_f_linear(rows):
    w, x = torch.randn(96, 64), torch.randn(rows, 64)
    torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    out = linear(x, w.bfloat16())  # fp32 states, bf16 rows (a head over a bf16 lm_head)
    assert out.dtype == torch.float32
    if native.available():  # float32 activations against the widened bf16 rows
        torch.testing.assert_close(out, F.linear(x, w.bfloat16().float()), rtol=1e-5, atol=1e-4)
    else:  # the product in bf16
        torch.testing.assert_close(out, F.linear(x.bfloat16(), w.bfloat16()).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("mode,cls", [("int4", Int4Linear), ("int8", Int8Linear)])
def test_quantized_layers_are_row_invariant(mode, cls, kernels, monkeypatch):
    """Row i of a T-row product is bit-identical to the 1-row product of row i: verifying k+1
    tokens computes what k+1 decode steps would (on the native kernels and PyTorch's)."""
    if kernels == "native" and not native.available():
        pytest.skip("the native kernels are not built")
    monkeypatch.setenv("SPECULANT_NATIVE", "1" if kernels == "native" else "0")
    layer = make_linear(torch.randn(160, 96), torch.randn(160), mode, torch.float32)
    assert isinstance(layer, cls)
    x = torch.randn(40, 96)
    full = layer(x)
    for rows in (1, 2, 5, 17, 40):
        assert torch.equal(layer(x[:rows]), full[:rows])
    assert all(torch.equal(layer(x[i : i + 1]), full[i : i + 1]) for i in range(40))


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_quantized_layers_approximate_the_float_product(mode):
    w, x = torch.randn(64, 128) * 0.05, torch.randn(4, 128)
    out = make_linear(w, None, mode, torch.float32)(x)
    reference = F.linear(x, w)
    tolerance = 0.15 if mode == "int4" else 0.03
    assert (out - reference).abs().max() <= tolerance * reference.abs().max()


def test_make_linear_keeps_or_converts_layouts():
    w = torch.randn(32, 64)
    assert isinstance(make_linear(quantize_int4(w), None, "auto", torch.float32), Int4Linear)
    assert isinstance(make_linear(quantize_int8(w), None, "auto", torch.float32), Int8Linear)
    assert isinstance(make_linear(w, None, "auto", torch.float32), DenseLinear)
    assert isinstance(make_linear(quantize_int4(w), None, "int8", torch.float32), Int8Linear)
    assert isinstance(make_linear(quantize_int8(w), None, "int4", torch.float32), Int4Linear)
    dense = make_linear(quantize_int4(w), None, "fp32", torch.float32)
    assert isinstance(dense, DenseLinear) and dense.weight.dtype == torch.float32
    # The int4 packer needs out % 16 == 0; other shapes fall back to int8 rows.
    assert isinstance(make_linear(torch.randn(24, 64), None, "int4", torch.float32), Int8Linear)


def test_quantizers_round_to_within_half_a_step():
    w = torch.randn(16, 64)
    q4 = quantize_int4(w)
    step = q4.scale.repeat_interleave(32, dim=1)
    assert ((q4.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    q8 = quantize_int8(w)
    assert ((q8.dequantize() - w).abs() <= q8.scale[:, None] / 2 + 1e-6).all()


def test_cat_rows_concatenates_along_outputs():
    a, b = torch.randn(16, 64), torch.randn(32, 64)
    fused = cat_rows([quantize_int4(a), quantize_int4(b)])
    assert isinstance(fused, Int4Groups) and fused.shape == (48, 64)
    torch.testing.assert_close(fused.dequantize(), torch.cat([quantize_int4(a).dequantize(), quantize_int4(b).dequantize()]))
    mixed = cat_rows([quantize_int4(a), quantize_int8(b)])
    assert isinstance(mixed, Int8Rows) and mixed.shape == (48, 64)
    assert torch.equal(cat_rows([a, b]), torch.cat([a, b]))
