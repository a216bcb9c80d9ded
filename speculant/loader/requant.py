"""ggml blocks -> the quantized layouts of `speculant.layers.quant`, without a float detour
where the formats agree.

Q4_0, Q4_1 and Q4_K keep their 4-bit integers: each 32-weight (sub-)block becomes one int4
group, w = (q - 8) * scale + zero, with
- Q4_0: w = d (q - 8)            -> scale = d,              zero = 0
- Q4_1: w = d q + m              -> scale = d,              zero = m + 8 d
- Q4_K: w = (d sc) q - dmin mn   -> scale = d sc,           zero = 8 d sc - dmin mn
(the zero is rounded once in float32, then the kernel rounds scale and zero to bfloat16).
The other block formats are dequantized and re-quantized to the layout nearest in bits: Q5_0,
Q5_1 and Q5_K to int4 groups (round to nearest, min/max per 32 weights: 5-bit weights are
nearer 4 bits than 8, and at half the bytes of int8 a Q5 draft model costs a third of its
target per token instead of a half), Q6_K and Q8_0 to int8 with one scale per row (ggml scales
per block of 32, PyTorch's int8 kernel per row). Every other block type (Q2_K, Q3_K, IQ*, TQ*,
MXFP4, NVFP4) has no kernel here: it is dequantized on load (`keeps_quantized` is false).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from speculant.layers.linear import int4_fits
from speculant.layers.quant import GROUP, Int4Groups, Int8Rows, quantize_int4, quantize_int8
from speculant.loader.dequant import _f16, _k_scales_mins, _nibbles, dequantize

INT4_TYPES = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K})
TO_INT4_TYPES = frozenset({GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q5_K})


def requantize(
    raw: np.ndarray, ggml_type: GGMLQuantizationType, shape: tuple[int, ...]
) -> Int4Groups | Int8Rows:
    """A 2-D quantized tensor's raw bytes -> Int4Groups (Q4, Q5 types) or Int8Rows (the others)."""
    if ggml_type in INT4_TYPES:
        return _int4(torch.from_numpy(raw), ggml_type, shape)
    values = dequantize(raw, ggml_type, shape)
    if ggml_type in TO_INT4_TYPES and int4_fits(shape):
        return quantize_int4(values)
    return quantize_int8(values)


def _int4(data: torch.Tensor, ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> Int4Groups:
    rows, cols = shape
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    blocks = data.reshape(-1, type_size)  # [n_blocks, type_size]
    if ggml_type == GGMLQuantizationType.Q4_K:
        q, scale, zero = _q4_k(blocks)
    else:
        offset = 2 if ggml_type == GGMLQuantizationType.Q4_0 else 4
        q = _nibbles(blocks[:, offset:], 1).reshape(-1, GROUP)
        scale = _f16(blocks[:, :2])  # [n_blocks, 1]
        zero = torch.zeros_like(scale) if offset == 2 else _f16(blocks[:, 2:4]) + 8 * scale
    groups = cols // GROUP
    return Int4Groups(q.reshape(rows, cols), scale.reshape(rows, groups), zero.reshape(rows, groups))


def _q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K super-blocks (d | dmin | scales[12] | qs[128]) -> q [n*8, 32], scale, zero [n, 8]."""
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    scale = _f16(blocks[:, :2]) * scales  # [n, 8]
    zero = 8 * scale - _f16(blocks[:, 2:4]) * mins
    q = _nibbles(blocks[:, 16:], 4).reshape(-1, GROUP)
    return q, scale, zero


# Block types a quantized kernel runs (as int4 groups or int8 rows); the others are dequantized.
KEPT_TYPES = INT4_TYPES | TO_INT4_TYPES | frozenset({GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0})


def keeps_quantized(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> bool:
    return ggml_type in KEPT_TYPES and len(shape) == 2
