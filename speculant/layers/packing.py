"""Quantized weights laid out for the native products (`kernels/csrc/int4.cpp`, `products.cpp`):
output rows in groups of 8, so that one vector's 8 lanes are 8 outputs, and within a 32-value
block the values of the 8 rows side by side (int4: 4 consecutive values a row; int8: pairs).
Rows are padded to a multiple of 8 (zero weights and scales); the kernel writes only the real
outputs."""

from __future__ import annotations

import torch

from speculant.layers.quant import GROUP, Int4Groups, Int8Rows

LANES = 8


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    extra = -t.shape[0] % LANES
    return t if extra == 0 else torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])


def _per_block(v: torch.Tensor) -> torch.Tensor:
    """[out, blocks] -> [out / 8, blocks * 8] float32: the 8 rows' values of a block side by side."""
    v = _pad_rows(v.float())
    return v.view(-1, LANES, v.shape[1]).transpose(1, 2).reshape(v.shape[0] // LANES, -1).contiguous()


def pack_int4(w: Int4Groups) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> packed [out/8, blocks * 128] uint8, d [out/8, blocks * 8], m [out/8, blocks * 8] (w = d q + m).
    Per block, 4 vectors of 32 bytes: vector j's byte 4r + i is q[r][4j + i] | q[r][16 + 4j + i] << 4,
    so a vector's low nibbles are 4 consecutive values of each of the group's 8 rows."""
    q = _pad_rows(w.q.to(torch.uint8))
    g, blocks = q.shape[0] // LANES, q.shape[1] // GROUP
    q = q.view(g, LANES, blocks, 2, 4, 4)  # [group, row, block, half, quad j, i]: k = 16 half + 4 j + i
    packed = q[:, :, :, 0] | (q[:, :, :, 1] << 4)  # [group, row, block, j, i]
    packed = packed.permute(0, 2, 3, 1, 4).reshape(g, blocks * 128).contiguous()
    return packed, _per_block(w.scale), _per_block(w.zero - 8 * w.scale)


def pack_int8(w: Int8Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """-> packed [out/8, blocks * 256] int8, scale [out/8 * 8] float32."""
    q = _pad_rows(w.q)
    g, blocks = q.shape[0] // LANES, q.shape[1] // GROUP
    packed = q.view(g, LANES, blocks, 16, 2).permute(0, 2, 3, 1, 4).reshape(g, blocks * 256).contiguous()
    return packed, _pad_rows(w.scale.float()).contiguous()
