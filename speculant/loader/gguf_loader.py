"""Weights of a GGUF file as Hugging Face-named, dequantized torch tensors."""

from __future__ import annotations

import torch

from speculant.config import ArchConfig
from speculant.loader.dequant import SUPPORTED_TYPES, dequantize
from speculant.loader.errors import CheckpointError
from speculant.loader.gguf_arch import PERMUTED_FAMILIES, arch_config, hf_name
from speculant.loader.gguf_file import GGUFFile
from speculant.loader.validate import check_shapes


def load_gguf_weights(
    gguf: GGUFFile, dtype: torch.dtype
) -> tuple[ArchConfig, dict[str, torch.Tensor]]:
    arch = arch_config(gguf)
    names = {hf: info.name for info in gguf.tensors.values() if (hf := hf_name(info.name))}
    # Shapes are checked from the tensor infos, before minutes of work could be wasted.
    check_shapes(arch, {hf: gguf.tensors[name].shape for hf, name in names.items()}, gguf.path)
    wanted = [hf for hf in names if hf != "lm_head.weight" or not arch.tie_word_embeddings]
    return arch, {hf: _load_tensor(gguf, names[hf], hf, arch, dtype) for hf in wanted}


def _load_tensor(
    gguf: GGUFFile, name: str, hf: str, arch: ArchConfig, dtype: torch.dtype
) -> torch.Tensor:
    info = gguf.tensors[name]
    if info.ggml_type not in SUPPORTED_TYPES:
        raise CheckpointError(gguf.path, f"unsupported tensor type {info.ggml_type.name}", name)
    tensor = dequantize(gguf.raw(name), info.ggml_type, info.shape, dtype)
    if arch.family in PERMUTED_FAMILIES:
        if hf.endswith("self_attn.q_proj.weight") or hf.endswith("self_attn.q_proj.bias"):
            tensor = unpermute_qk(tensor, arch.num_heads)
        elif hf.endswith("self_attn.k_proj.weight") or hf.endswith("self_attn.k_proj.bias"):
            tensor = unpermute_qk(tensor, arch.num_kv_heads)
    return tensor


def unpermute_qk(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    HF rotates the two halves of each head's dimensions (rotate_half); ggml's rope rotates
    adjacent pairs, so the converter interleaves each head's rows: rows [h, 2, d/2] are stored
    as [h, d/2, 2]. We swap them back.
    """
    rows = tensor.shape[0]
    per_head = tensor.reshape(num_heads, rows // num_heads // 2, 2, *tensor.shape[1:])
    return per_head.transpose(1, 2).reshape(tensor.shape)


def permute_qk(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's converter permutation (the inverse of `unpermute_qk`); used to write GGUFs."""
    rows = tensor.shape[0]
    per_head = tensor.reshape(num_heads, 2, rows // num_heads // 2, *tensor.shape[1:])
    return per_head.transpose(1, 2).reshape(tensor.shape)
