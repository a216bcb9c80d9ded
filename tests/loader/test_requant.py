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


@pytest.mark.parametrize(
    "qtype", [QType.Q8_0, QType.Q5_0, QType.Q5_1, QType.Q5_K, QType.Q6_K], ids=lambda q: q.name
)
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
