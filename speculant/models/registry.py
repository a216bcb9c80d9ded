"""Model families by name, imported lazily."""

from __future__ import annotations

import importlib

import torch

from speculant.config import ArchConfig
from speculant.models.base import CausalLM

_FAMILIES = {
    "llama": "speculant.models.llama:LlamaForCausalLM",
    "mistral": "speculant.models.llama:LlamaForCausalLM",
    "qwen2": "speculant.models.llama:LlamaForCausalLM",
    "phi3": "speculant.models.llama:LlamaForCausalLM",  # fused products split on load
    "qwen3": "speculant.models.variants:LlamaVariantForCausalLM",
    "gemma3": "speculant.models.variants:LlamaVariantForCausalLM",
    "deepseek_v3": "speculant.models.deepseek_v3:DeepseekV3ForCausalLM",
}


def create_model(arch: ArchConfig, device: torch.device, dtype: torch.dtype, weights: str = "fp32") -> CausalLM:
    """`weights`: how Linear weights are held (`ModelConfig.weights`)."""
    if arch.family not in _FAMILIES:
        raise ValueError(f"model family {arch.family!r} is not supported; supported: {sorted(_FAMILIES)}")
    module_name, cls_name = _FAMILIES[arch.family].split(":")
    return getattr(importlib.import_module(module_name), cls_name)(arch, device, dtype, weights)
