"""GGUF blocks kept quantized: the int4/int8 layouts against gguf.quants' own dequantized values."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from test_dequant import _random_k_blocks

from speculant.layers.linear import Int4Linear, Int8Linear
from speculant.layers.quant import Int4Groups, Int8Rows
from speculant.loader.requant import requantize

ROWS = 48  # a multiple of 16, as the int4 packer wants


def _raw(qtype: QType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(raw blocks of a [ROWS, 512] tensor, gguf's dequantized float32 values)."""
    if qtype in (QType.Q4_K, QType.Q5_K, QType.Q6_K):
        raw = _random_k_blocks(qtype, ROWS * 2, rng).reshape(ROWS, -1)
    else:
        raw = gguf.quants.quantize(rng.normal(size=(ROWS, 512)).astype(np.float32), qtype)
    return raw.reshape(-1), gguf.quants.dequantize(raw.reshape(ROWS, -1), qtype)


@pytest.mark.parametrize("qtype", [QType.Q4_0, QType.Q4_1, QType.Q4_K], ids=lambda q: q.name)
def test_4bit_blocks_keep_their_integers(qtype):
    raw, expected = _raw(qtype, np.random.default_rng(0))
    weight = requantize(raw, qtype, (ROWS, 512))
    assert isinstance(weight, Int4Groups)
    # Only the zero (m + 8d, 8 d sc - dmin mn) is rounded once more, in float32.
    scale = np.abs(expected).max()
    np.testing.assert_allclose(weight.dequantize().numpy(), expected, rtol=0, atol=4e-7 * scale)


@pytest.mark.parametrize("qtype", [QType.Q5_0, QType.Q5_1, QType.Q5_K], ids=lambda q: q.name)
def test_5bit_blocks_become_int4_groups_within_half_a_step(qtype):
    raw, expected = _raw(qtype, np.random.default_rng(3))
    weight = requantize(raw, qtype, (ROWS, 512))
    assert isinstance(weight, Int4Groups)
    half_step = weight.scale.repeat_interleave(32, dim=1).numpy() / 2
    error = np.abs(weight.dequantize().numpy() - expected)
    assert (error <= half_step + 1e-6 * np.abs(expected).max()).all()


@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q6_K], ids=lambda q: q.name)
def test_other_blocks_become_int8_rows_within_half_a_step(qtype):
    raw, expected = _raw(qtype, np.random.default_rng(1))
    weight = requantize(raw, qtype, (ROWS, 512))
    assert isinstance(weight, Int8Rows)
    half_step = np.abs(expected).max(axis=1, keepdims=True) / 254
    error = np.abs(weight.dequantize().numpy() - expected)
    assert (error <= half_step * (1 + 1e-5)).all()


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q4_K, QType.Q8_0], ids=lambda q: q.name)
def test_quantized_products_match_the_gguf_values(qtype):
    """The kernel rounds activations, scales and zeros to bfloat16: about 3 significant digits."""
    raw, expected = _raw(qtype, np.random.default_rng(2))
    weight = requantize(raw, qtype, (ROWS, 512))
    layer = Int4Linear(weight) if isinstance(weight, Int4Groups) else Int8Linear(weight)
    x = torch.randn(5, 512)
    reference = x.double() @ torch.from_numpy(expected).double().t()
    error = (layer(x).double() - reference).abs().max()
    assert error <= 0.02 * reference.abs().max()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q4_K, QType.Q8_0, QType.F16], ids=lambda q: q.name)
def test_gguf_kept_quantized_matches_its_dequantized_load(request, gguf_writer, family, qtype):
    """Linear weights come out in the quantized layouts (q/k rows unpermuted like the float
    ones); norms, biases and the embedding table stay float; a tied head gets its own copy."""
    from speculant.loader import load_checkpoint

    path, expected = gguf_writer(request.getfixturevalue(f"tiny_{family}_dir"), qtype)
    kept = load_checkpoint(str(path), keep_quantized=True).weights
    assert expected.keys() <= kept.keys()
    for name, reference in expected.items():
        weight = kept[name]
        if qtype == QType.F16 or reference.dim() == 1 or "embed_tokens" in name:
            assert torch.equal(weight, reference), name
            continue
        assert isinstance(weight, Int4Groups if qtype != QType.Q8_0 else Int8Rows), name
        bound = 4e-7 if isinstance(weight, Int4Groups) else 1 / 254 * (1 + 1e-5)
        error = (weight.dequantize() - reference).abs().max()
        assert error <= bound * reference.abs().max(), name
    if "lm_head.weight" not in expected and qtype != QType.F16:
        head = kept["lm_head.weight"].dequantize()
        assert (head - expected["model.embed_tokens.weight"]).abs().max() <= 0.01 * head.abs().max()
