"""RMSNorm for the decoder: one native call per norm (and per residual add before it) on a CPU
when the native kernels are built and nothing needs gradients; `F.rms_norm` otherwise (a GPU,
training). The native norm is row-invariant: a token's row is the same in any batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speculant.kernels import native


def _kernels(x: torch.Tensor, weight: torch.Tensor):
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() != 2:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    return native.module()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # [T, H] -> [T, H]
    kernels = _kernels(x, weight)
    if kernels is None:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return kernels.rms_norm(x.contiguous(), weight, eps, native.use_avx2())


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)), x and residual [T, H]."""
    kernels = _kernels(x, weight)
    if kernels is None or residual.dtype != torch.float32:
        x = x + residual
        return x, F.rms_norm(x, (x.shape[-1],), weight, eps)
    return kernels.add_rms_norm(x.contiguous(), residual.contiguous(), weight, eps, native.use_avx2())
