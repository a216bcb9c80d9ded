"""Attention backends by name, imported lazily so a CPU import never touches CUDA code."""

from __future__ import annotations

import importlib
import importlib.util

import torch

from speculant.attention.base import AttentionBackend
from speculant.kernels import native

_BACKENDS = {
    "torch": "speculant.attention.torch_backend:TorchAttention",
    "native": "speculant.attention.native_backend:NativeAttention",
    "flashinfer": "speculant.attention.flashinfer_backend:FlashInferAttention",
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype = torch.float16) -> str:
    """"auto" picks flashinfer on CUDA for fp16/bf16 when it is installed (its kernels have no
    fp32 path), the row-invariant native kernel on the CPU when it is built, else the torch
    reference."""
    if name != "auto":
        return name
    half = dtype in (torch.float16, torch.bfloat16)
    if device.type == "cuda" and half and importlib.util.find_spec("flashinfer") is not None:
        return "flashinfer"
    if device.type == "cpu" and native.available():
        return "native"
    return "torch"


def create_backend(name: str, device: torch.device, dtype: torch.dtype = torch.float32, **kwargs) -> AttentionBackend:
    name = resolve_backend_name(name, device, dtype)
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend must be one of {['auto'] + available_backends()}, got {name!r}")
    module_name, cls_name = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)(device=device, **kwargs)
