"""Linear layers: one object per weight, its kernel chosen when the model is loaded.

`make_linear(weight, bias, mode)` returns a `DenseLinear` (float weights), an `Int4Linear` or an
`Int8Linear`; the model calls `layer(x)` and never looks at dtypes.

On a CPU every layer runs on the native kernels (`speculant.kernels`) when they are built: float32
output, and each output row computed by one fixed sequence of operations whatever the row count,
so a (k+1)-row verification, a prefill chunk or a batch computes each row bit for bit as a
one-row step does (batch invariance). Quantized weights take activations quantized per 32-value
block to int16 (exact integer dot products per block); float weights accumulate in float32.
Where the native kernels are not built (`SPECULANT_NATIVE=0`, no compiler), the pure-torch kernels
below serve, fast but row-dependent (the per-bucket choice, oneDNN, bf16 outputs).

Notes on the pure-torch kernels, from a 2-core machine (AVX-512 with BF16 dot products, MKL):
- `F.linear` with few rows is several times slower than `(W @ x^T)^T`; for one row MKL's GEMV
  streams the weight on one core, so splitting the weight's rows into one batch per thread
  (`bmm`, "rowsplit") streams it on all cores; oneDNN's inner product on a pre-packed weight
  keeps 2-16 rows close to the cost of one. Which wins differs per shape, hence the measurement.
- The int4/int8 kernels are fast with bfloat16 activations (fp32 activations take a reference
  path ~50x slower), so activations are rounded to bf16 for the product and the result widened.
  Each output row depends only on its own input row (tests/layers check this bit for bit), so
  a (k+1)-row verification computes what k+1 one-row decode steps would.
- Half-precision dense weights read half the bytes; whether their product of many rows is fast
  depends on the CPU (with AVX-512 bf16 dot products a 256-row bf16 product is ~6x faster than
  widening the weight to fp32 for it; without them the widened product wins), so widening
  ("widen") is one more kernel the per-bucket measurement chooses from.
"""

from __future__ import annotations

import torch

from speculant.kernels import native
from speculant.layers import autotune, packing
from speculant.layers.quant import GROUP, Int4Groups, Int8Rows, quantize_int4, quantize_int8

WEIGHT_MODES = ("auto", "fp32", "bf16", "int8", "int4")


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, keep_weight: bool = True) -> None:
        """keep_weight=False: a layer's own weight (nobody else reads it) is let go when every
        bucket runs on the oneDNN packed copy, instead of holding the weight twice (on the
        qwen2.5-coder 1.5B target that is 4.6 GB of fp32 kept for nothing)."""
        self.shape, self.dtype = weight.shape, weight.dtype
        self.native = None if autotune.forced() else _native_for(weight)
        if self.native is not None:
            self.weight, self.bias = weight.contiguous(), None if bias is None else bias.float()
            self.kernels, self.packed = {}, None
            return
        bias = None if bias is None else bias.to(weight.dtype)  # a native bf16 product takes a bf16 bias
        self.weight, self.bias = weight, bias  # [out, in], [out]; weight None: only the packed copy
        self.kernels = autotune.kernels_for(weight)  # bucket -> kernel name
        self.packed = autotune.pack(weight, self.kernels)
        if not keep_weight and set(self.kernels.values()) == {"onednn"}:
            self.weight = None

    def native_operands(self) -> tuple | None:
        """(kind, operands, bias, out) for the native decoder stack (`kernels/csrc/stack.cpp`),
        None where this product does not run on the native kernels."""
        return None if self.native is None else (2, [self.weight], self.bias, self.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        w = self.weight
        if self.native is not None:
            return self.native.dense_linear(_rows_f32(x), w, self.bias, native.use_avx2()).to(x.dtype)
        if x.device.type != "cpu":
            return torch.nn.functional.linear(x, w, self.bias)
        kernel = self.kernels[autotune.bucket(x.shape[0])]
        operand = x if kernel == "widen" else x.to(self.dtype)  # widen: activations kept as they are
        return autotune.run(kernel, operand, w, self.packed, self.bias).to(x.dtype)


class Int4Linear:
    """Group-wise int4 weight: two values a byte for the native kernel (w = d * q + m per group),
    else packed for `_weight_int4pack_mm_for_cpu`."""

    def __init__(self, weight: Int4Groups, bias: torch.Tensor | None = None) -> None:
        self.shape, self.bias = weight.shape, bias
        self.native = _native_for(weight.q)
        if self.native is not None:
            self.packed, self.d, self.m = packing.pack_int4(weight)  # see layers/packing.py
            return
        self.packed = torch._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 2)
        scale_zero = torch.stack([weight.scale, weight.zero], dim=-1)  # [out, groups, 2]
        self.scale_zero = scale_zero.transpose(0, 1).contiguous().bfloat16()  # [groups, out, 2]

    def native_operands(self) -> tuple | None:
        return None if self.native is None else (0, [self.packed, self.d, self.m], self.bias, self.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.native is not None:
            out = self.native.int4_linear(_rows_f32(x), self.packed, self.d, self.m, self.shape[0], native.simd())
        else:
            out = torch._weight_int4pack_mm_for_cpu(x.bfloat16(), self.packed, GROUP, self.scale_zero)
        out = out.to(x.dtype)
        return out if self.bias is None else out.add_(self.bias)


class Int8Linear:
    """Int8 weight with one scale per output row, for `_weight_int8pack_mm`."""

    def __init__(self, weight: Int8Rows, bias: torch.Tensor | None = None) -> None:
        self.shape, self.bias = weight.shape, bias
        self.native = _native_for(weight.q)
        if self.native is not None:
            self.q, self.scale = packing.pack_int8(weight)  # see layers/packing.py
        else:
            self.q, self.scale = weight.q.contiguous(), weight.scale.bfloat16()

    def native_operands(self) -> tuple | None:
        return None if self.native is None else (1, [self.q, self.scale], self.bias, self.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.native is not None:
            out = self.native.int8_linear(_rows_f32(x), self.q, self.scale, self.shape[0], native.simd()).to(x.dtype)
        else:
            out = torch._weight_int8pack_mm(x.bfloat16(), self.q, self.scale).to(x.dtype)
        return out if self.bias is None else out.add_(self.bias)


Linear = DenseLinear | Int4Linear | Int8Linear


def int4_fits(shape: torch.Size | tuple[int, ...]) -> bool:
    """The int4 packer needs whole groups along the input and out % 16 == 0."""
    return shape[1] % GROUP == 0 and shape[0] % 16 == 0


def make_linear(weight, bias: torch.Tensor | None, mode: str, dtype: torch.dtype, keep_weight: bool = True) -> Linear:
    """The layer for one weight: a quantized weight stays quantized (unless mode asks for a
    float one), a float weight is quantized when mode is "int8"/"int4". keep_weight=False: see
    `DenseLinear`."""
    if mode in ("fp32", "bf16"):
        return DenseLinear(_dense(weight, torch.bfloat16 if mode == "bf16" else dtype), bias, keep_weight)
    if isinstance(weight, torch.Tensor) and mode == "auto":
        return DenseLinear(weight.to(dtype), bias, keep_weight)
    if mode == "int4" and not isinstance(weight, Int4Groups):
        weight = quantize_int4(_dense(weight, torch.float32)) if int4_fits(weight.shape) else weight
    if mode == "int8" and not isinstance(weight, Int8Rows):
        weight = quantize_int8(_dense(weight, torch.float32))
    if isinstance(weight, Int4Groups) and int4_fits(weight.shape):
        return Int4Linear(weight, bias)
    if not isinstance(weight, Int8Rows):
        weight = quantize_int8(_dense(weight, torch.float32))
    return Int8Linear(weight, bias)


def _dense(weight, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(weight, torch.Tensor):
        return weight.to(dtype)
    return weight.dequantize().to(dtype)


def _native_for(weight: torch.Tensor):
    """The native kernels' module for a CPU weight whose dtype and input size they take, else None."""
    if weight.device.type != "cpu" or weight.shape[1] % GROUP or weight.dtype in (torch.float16, torch.float64):
        return None
    return native.module()


def _rows_f32(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], weight [out, in], bias [out] -> [T, out] in x's dtype (a head's rows gathered
    from the lm_head): the native dense kernel where it runs (row-invariant, float32
    accumulation), else the row-split/GEMM kernels in the weight's dtype."""
    kernels = _native_for(weight)
    if kernels is not None:
        b = None if bias is None else bias.float()
        return kernels.dense_linear(_rows_f32(x), weight.contiguous(), b, native.use_avx2()).to(x.dtype)
    kernel = "rowsplit" if x.shape[0] == 1 else "mm"
    return autotune.run(kernel, x.to(weight.dtype), weight, None, bias).to(x.dtype)
