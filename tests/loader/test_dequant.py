"""The torch dequantizers are bit-identical to gguf.quants, the numpy reference; every type it
decodes is supported (the others through gguf.quants itself)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType

from speculant.loader.dequant import NUMPY_TYPES, SUPPORTED_TYPES, dequantize
from speculant.loader.gguf_loader import permute_qk, unpermute_qk

QUANTIZABLE = [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0]
K_QUANTS = [QType.Q4_K, QType.Q5_K, QType.Q6_K]


def _random_k_blocks(qtype: QType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scales = rng.normal(0, 1e-2, size=(n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == QType.Q6_K:
        blocks[:, -2:] = scales[:, :2]
    else:
        blocks[:, :4] = scales
    return blocks


# Enough rows that the tensor spans several chunks (and so several threads).
@pytest.mark.parametrize("rows", [3, 1100])
@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_block_quants_match_reference(qtype, rows):
    weights = np.random.default_rng(0).normal(size=(rows, 256)).astype(np.float32)
    raw = gguf.quants.quantize(weights, qtype)
    expected = gguf.quants.dequantize(raw, qtype)
    ours = dequantize(raw.reshape(-1), qtype, weights.shape)
    assert np.array_equal(ours.numpy(), expected)


@pytest.mark.parametrize("rows", [2, 1100])
@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda q: q.name)
def test_k_quants_match_reference(qtype, rows):
    blocks = _random_k_blocks(qtype, rows * 2, np.random.default_rng(1))  # rows of 512 weights
    expected = gguf.quants.dequantize(blocks.reshape(rows, -1), qtype)
    ours = dequantize(blocks.reshape(-1), qtype, (rows, 512))
    assert np.array_equal(ours.numpy(), expected)


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16], ids=lambda q: q.name)
def test_plain_types(qtype):
    weights = np.random.default_rng(2).normal(size=(4, 64)).astype(np.float32)
    raw = weights if qtype != QType.BF16 else None
    if qtype == QType.F16:
        raw = weights.astype(np.float16)
    elif qtype == QType.BF16:
        raw = gguf.quants.quantize(weights, QType.BF16)
    expected = gguf.quants.dequantize(raw, qtype)
    ours = dequantize(raw.view(np.uint8).reshape(-1), qtype, weights.shape)
    assert np.array_equal(ours.numpy(), expected)
    assert ours.data_ptr() != raw.ctypes.data  # a copy, never a view of the file


def _reference_decodes(qtype: QType) -> bool:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size * (256 // block_size)), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def test_supported_types_are_every_type_the_reference_decodes():
    assert {q for q in QType if _reference_decodes(q)} == SUPPORTED_TYPES
    assert set(QUANTIZABLE + K_QUANTS + [QType.F32, QType.F16, QType.BF16]) | NUMPY_TYPES == SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", sorted(NUMPY_TYPES), ids=lambda q: q.name)
def test_other_block_types_are_the_reference(qtype):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 3, 512
    blocks = np.random.default_rng(4).integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)
    expected = gguf.quants.dequantize(blocks.reshape(rows, -1), qtype)
    ours = dequantize(blocks.reshape(-1), qtype, (rows, cols))
    assert ours.shape == (rows, cols) and ours.dtype == torch.float32
    assert np.array_equal(ours.numpy(), expected, equal_nan=True)  # random scale bytes: NaN at times
    halves = dequantize(blocks.reshape(-1), qtype, (rows, cols), torch.bfloat16)
    assert torch.equal(halves.float().nan_to_num(), torch.from_numpy(expected).bfloat16().float().nan_to_num())


def test_unpermute_inverts_permute():
    weight = torch.randn(4 * 64, 32)
    assert torch.equal(unpermute_qk(permute_qk(weight, 4), 4), weight)
    assert not torch.equal(permute_qk(weight, 4), weight)


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q6_K, QType.F16], ids=lambda q: q.name)
def test_bfloat16_output_rounds_the_float32_result_once(qtype):
    rows = 700  # several chunks
    if qtype == QType.Q6_K:
        raw = _random_k_blocks(qtype, rows, np.random.default_rng(3))
    else:
        raw = gguf.quants.quantize(
            np.random.default_rng(3).normal(size=(rows, 256)).astype(np.float32), qtype
        )
    flat = raw.view(np.uint8).reshape(-1)
    in_float = dequantize(flat, qtype, (rows, 256))
    assert torch.equal(
        dequantize(flat, qtype, (rows, 256), torch.bfloat16), in_float.to(torch.bfloat16)
    )
