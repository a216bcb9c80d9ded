"""Dequantization of ggml block formats to float32, vectorised in PyTorch.

Each format packs a row into fixed-size blocks (32 weights, or 256 for the K-quants) of scales
and packed integers; the layouts follow ggml-quants.c. The float arithmetic is done in the same
order as `gguf.quants` (the numpy reference), one rounding per operation, so the results are
bit-identical to it (tests/loader/test_dequant.py checks this), while torch's kernels use every
core and skip numpy's temporaries. The block types without a routine here (Q2_K, Q3_K, the IQ,
TQ and FP4 types: `NUMPY_TYPES`) are dequantized by `gguf.quants` itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

QK_K = 256  # weights per K-quant super-block
_CHUNK_WEIGHTS = 1 << 18  # weights dequantized per task: 1 MiB of float32 output


def _f16(column: torch.Tensor) -> torch.Tensor:
    """[n_blocks, 2] uint8 -> [n_blocks, 1] float32 read as little-endian float16."""
    return column.contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor, groups: int) -> torch.Tensor:
    """[n, groups*L] uint8 -> [n, groups, 2, L]: low nibbles of each group, then high nibbles."""
    # Scalar shifts on a contiguous copy: torch's broadcast uint8 shifts are several times slower.
    grouped = packed.contiguous().reshape(packed.shape[0], groups, 1, -1)
    return torch.cat([grouped & 0x0F, grouped >> 4], dim=2)


def _bits(packed: torch.Tensor) -> torch.Tensor:
    """[n, k] uint8 -> [n, 8k] uint8: bit i of byte j at position 8j + i (little-endian bits)."""
    return torch.from_numpy(np.unpackbits(packed.numpy(), axis=-1, bitorder="little"))


# Each block function reads blocks [n, type_size] uint8 and writes out [n, block_size] float32.
# Multiplying a float scale by the integer tensor directly (torch casts inside the kernel) and
# finishing in place into `out` saves two output-sized passes over memory per chunk.


def _q4_0(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d f16 | qs[16]
    q = _nibbles(blocks[:, 2:], 1).reshape(out.shape).to(torch.int8) - 8
    torch.mul(_f16(blocks[:, :2]), q, out=out)


def _q4_1(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d f16 | m f16 | qs[16]
    q = _nibbles(blocks[:, 4:], 1).reshape(out.shape)
    torch.mul(_f16(blocks[:, :2]), q, out=out)
    out.add_(_f16(blocks[:, 2:4]))


def _q5(low_high: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """5-bit values from [n, 16] packed low nibbles and [n, 4] bytes of high bits -> [n, 32]."""
    packed_low, packed_high = low_high
    low = _nibbles(packed_low, 1).reshape(packed_low.shape[0], 32)
    return low | (_bits(packed_high) << 4)


def _q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d f16 | qh u32 | qs[16]
    q = _q5((blocks[:, 6:], blocks[:, 2:6])).to(torch.int8) - 16
    torch.mul(_f16(blocks[:, :2]), q, out=out)


def _q5_1(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d f16 | m f16 | qh u32 | qs[16]
    q = _q5((blocks[:, 8:], blocks[:, 4:8]))
    torch.mul(_f16(blocks[:, :2]), q, out=out)
    out.add_(_f16(blocks[:, 2:4]))


def _q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d f16 | qs int8[32]
    torch.mul(blocks[:, 2:].view(torch.int8), _f16(blocks[:, :2]), out=out)


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins, each [n, 8] uint8.

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7; bytes 4-7 the same
    for the mins; bytes 8-11 the low nibbles of scales 4-7 (low) and mins 4-7 (high).
    """
    groups = packed.reshape(packed.shape[0], 3, 4)
    sc_lo, mn_lo, mixed = groups[:, 0], groups[:, 1], groups[:, 2]
    scales = torch.cat([sc_lo & 0x3F, (mixed & 0x0F) | ((sc_lo >> 2) & 0x30)], dim=1)
    mins = torch.cat([mn_lo & 0x3F, (mixed >> 4) | ((mn_lo >> 2) & 0x30)], dim=1)
    return scales, mins


def _k_affine(blocks: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> None:
    """out = (d * scale) * q - (dmin * min) per 32-weight sub-block; q is [n, 8, 32] uint8."""
    n = blocks.shape[0]
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    d_sub = (_f16(blocks[:, :2]) * scales).reshape(n, 8, 1)
    m_sub = (_f16(blocks[:, 2:4]) * mins).reshape(n, 8, 1)
    sub_blocks = out.view(n, 8, 32)
    torch.mul(d_sub, q, out=sub_blocks)
    sub_blocks.sub_(m_sub)


def _q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d | dmin | scales[12] | qs[128]
    _k_affine(blocks, _nibbles(blocks[:, 16:], 4).reshape(-1, 8, 32), out)


def _q5_k(blocks: torch.Tensor, out: torch.Tensor) -> None:  # d | dmin | sc[12] | qh[32] | qs[128]
    n = blocks.shape[0]
    low = _nibbles(blocks[:, 48:], 4).reshape(n, 8, 32)
    # qh: bit i of byte j is the high bit of weight 32*i + j.
    high = _bits(blocks[:, 16:48]).reshape(n, 32, 8).transpose(1, 2)  # [n, 8, 32]
    _k_affine(blocks, low | (high << 4), out)


def _q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:  # ql[128] | qh[64] | sc i8[16] | d
    n = blocks.shape[0]
    low = _nibbles(blocks[:, :128], 2).reshape(n, 8, 32)
    qh = blocks[:, 128:192].contiguous().reshape(n, 2, 1, 32)
    high = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=2)  # [n, 2, 4, 32]
    q = (low | (high.reshape(n, 8, 32) << 4)).to(torch.int8) - 32
    scales = blocks[:, 192:208].contiguous().view(torch.int8)
    d_sub = (_f16(blocks[:, 208:210]) * scales).reshape(n, 16, 1)
    torch.mul(d_sub, q.reshape(n, 16, 16), out=out.view(n, 16, 16))


_BLOCK_DEQUANT: dict[GGMLQuantizationType, Callable[[torch.Tensor, torch.Tensor], None]] = {
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q5_1: _q5_1,
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}
_PLAIN = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}
# Block types without a torch routine here: `gguf.quants` (numpy, one thread) dequantizes them.
_Q = GGMLQuantizationType
NUMPY_TYPES = frozenset(
    {_Q.Q2_K, _Q.Q3_K, _Q.IQ1_S, _Q.IQ1_M, _Q.IQ2_XXS, _Q.IQ2_XS, _Q.IQ2_S, _Q.IQ3_XXS, _Q.IQ3_S,
     _Q.IQ4_NL, _Q.IQ4_XS, _Q.TQ1_0, _Q.TQ2_0, _Q.MXFP4, _Q.NVFP4}
)  # fmt: skip
SUPPORTED_TYPES = frozenset(_BLOCK_DEQUANT) | frozenset(_PLAIN) | NUMPY_TYPES


def dequantize(
    raw: np.ndarray,
    ggml_type: GGMLQuantizationType,
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A tensor's raw bytes (uint8, as stored) -> a new tensor of `shape` and `dtype`.

    Values are computed in float32 and rounded once to `dtype`, so a bfloat16 result equals the
    float32 one converted, without ever holding the whole tensor in float32.
    """
    data = torch.from_numpy(raw)
    if ggml_type in _PLAIN:
        values = data.view(_PLAIN[ggml_type]).reshape(shape)
        return values.to(dtype, copy=True)  # a copy: never hand out a view of the file
    if ggml_type in NUMPY_TYPES:
        values = gguf_quants.dequantize(raw.reshape(-1, GGML_QUANT_SIZES[ggml_type][1]), ggml_type)
        return torch.from_numpy(values).reshape(shape).to(dtype)
    if ggml_type not in _BLOCK_DEQUANT:
        raise ValueError(f"ggml type {ggml_type.name} is not supported")  # validate.py reports it first
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    blocks = data.reshape(-1, type_size)  # [n_blocks, type_size]
    out = torch.empty(blocks.shape[0], block_size, dtype=dtype)  # [n_blocks, block_size]
    _run_chunked(_BLOCK_DEQUANT[ggml_type], blocks, out)
    return out.reshape(shape)


def _run_chunked(
    fn: Callable[[torch.Tensor, torch.Tensor], None], blocks: torch.Tensor, out: torch.Tensor
) -> None:
    """fn(blocks[chunk], out[chunk]) over chunks of blocks, spread over a thread per core.

    Whole-tensor ops would allocate several temporaries the size of the output and fault in
    every page of each; chunks of ~1 MiB of output keep the temporaries in cache, and torch's
    kernels release the GIL, so threads work on different chunks at once.
    """
    step = max(1, _CHUNK_WEIGHTS // out.shape[1])
    starts = range(0, blocks.shape[0], step)

    def work(start: int) -> None:
        chunk = out[start : start + step]
        if chunk.dtype == torch.float32:
            fn(blocks[start : start + step], chunk)
        else:
            in_float = torch.empty(chunk.shape)
            fn(blocks[start : start + step], in_float)
            chunk.copy_(in_float)

    if len(starts) == 1:
        work(0)
    else:
        list(_pool().map(work, starts))


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="dequant")
