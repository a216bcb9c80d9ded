"""Quantized weight layouts the CPU kernels consume, before packing.

`Int4Groups` is PyTorch's group-wise int4 layout (`_weight_int4pack_mm_for_cpu`): every group of
32 input weights of a row has a scale and a zero, and w = (q - 8) * scale + zero with q in 0..15.
ggml's Q4_0 (w = d * (q - 8)), Q4_1 (w = d * q + m) and Q4_K (w = d_sub * q - m_sub per 32-weight
sub-block) are exactly this form, so their integers are kept as they are.
`Int8Rows` is `_weight_int8pack_mm`'s layout: int8 weights and one scale per output row.
Both keep rows first, so row permutations and concatenations along the output dimension apply
to every field alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32  # input weights per int4 scale/zero group (ggml's block size)


@dataclass
class Int4Groups:
    q: torch.Tensor  # [out, in] uint8, values 0..15
    scale: torch.Tensor  # [out, in // GROUP] float32
    zero: torch.Tensor  # [out, in // GROUP] float32: the value of q = 8

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def map_rows(self, fn) -> Int4Groups:
        return Int4Groups(fn(self.q), fn(self.scale), fn(self.zero))

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        out, n_in = self.q.shape
        q = self.q.view(out, n_in // GROUP, GROUP).float() - 8
        return (q * self.scale[..., None] + self.zero[..., None]).view(out, n_in)


@dataclass
class Int8Rows:
    q: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out] float32

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def map_rows(self, fn) -> Int8Rows:
        return Int8Rows(fn(self.q), fn(self.scale))

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        return self.q.float() * self.scale[:, None]


QuantizedWeight = Int4Groups | Int8Rows


def quantize_int4(weight: torch.Tensor) -> Int4Groups:
    """Round-to-nearest asymmetric int4 per group of 32 (min/max of the group span 0..15)."""
    out, n_in = weight.shape
    groups = weight.float().reshape(out, n_in // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return Int4Groups(q.to(torch.uint8).reshape(out, n_in), scale, low + 8 * scale)


def quantize_int8(weight: torch.Tensor) -> Int8Rows:
    """Symmetric int8 per output row: scale = max |w| / 127."""
    w = weight.float()
    scale = (w.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return Int8Rows(q, scale)


def cat_rows(parts: list) -> torch.Tensor | QuantizedWeight:
    """Concatenate weights along the output dimension (fused q/k/v and gate/up)."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    kinds = {type(p) for p in parts}
    if len(kinds) != 1:  # mixed ggml types in one fused product: widen to int8 rows
        parts = [p if isinstance(p, Int8Rows) else quantize_int8(_dense(p)) for p in parts]
    if isinstance(parts[0], Int4Groups):
        return Int4Groups(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "scale", "zero")))
    return Int8Rows(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))


def _dense(weight) -> torch.Tensor:
    return weight if isinstance(weight, torch.Tensor) else weight.dequantize()
