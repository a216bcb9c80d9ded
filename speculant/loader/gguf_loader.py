"""Weights of a GGUF file as Hugging Face-named torch tensors: dequantized, or (`keep_quantized`)
with Linear weights in the quantized layouts of `speculant.layers.quant`. DeepSeek files
(`deepseek2`) go through `gguf_deepseek`, always dequantized."""

from __future__ import annotations

import torch

from speculant.config import ArchConfig
from speculant.loader.dequant import SUPPORTED_TYPES, dequantize
from speculant.loader.errors import CheckpointError
from speculant.loader.fused import split_fused
from speculant.loader.gguf_arch import PERMUTED_FAMILIES, arch_config, hf_name
from speculant.loader.gguf_deepseek_arch import ARCH as DEEPSEEK_ARCH
from speculant.loader.gguf_file import GGUFFile
from speculant.loader.gguf_variants import to_hf_norm
from speculant.loader.requant import keeps_quantized, requantize
from speculant.loader.validate import FUSED_FAMILIES, check_shapes


def load_gguf_weights(
    gguf: GGUFFile, dtype: torch.dtype, keep_quantized: bool = False, slices=None
) -> tuple[ArchConfig, dict]:
    """`slices(name, arch)` -> (dim, start, stop) keeps that part of each dequantized tensor."""
    if gguf.metadata.get("general.architecture") == DEEPSEEK_ARCH:
        if slices is not None:
            raise CheckpointError(gguf.path, "sliced loading (tensor parallelism) covers the Llama family only")
        from speculant.loader.gguf_deepseek import load_deepseek_gguf

        return load_deepseek_gguf(gguf, dtype)
    arch = arch_config(gguf)
    if slices is not None and keep_quantized:
        raise CheckpointError(gguf.path, "sliced loading (tensor parallelism) dequantizes: keep_quantized must be off")
    if slices is not None and (not arch.is_llama_layer or arch.family in FUSED_FAMILIES):
        raise CheckpointError(gguf.path, f"sliced loading (tensor parallelism) covers the Llama family only, not {arch.family}")
    names = {hf: info.name for info in gguf.tensors.values() if (hf := hf_name(info.name, arch.family))}
    # Shapes are checked from the tensor infos, before minutes of work could be wasted.
    check_shapes(arch, {hf: gguf.tensors[name].shape for hf, name in names.items()}, gguf.path)
    wanted = [hf for hf in names if hf != "lm_head.weight" or not arch.tie_word_embeddings]
    weights = {hf: _cut(_load_tensor(gguf, names[hf], hf, arch, dtype, keep_quantized), hf, arch, slices) for hf in wanted}
    embed = names.get("model.embed_tokens.weight")
    if keep_quantized and "lm_head.weight" not in weights and embed is not None:
        # A tied head keeps the embedding's blocks; the lookup table itself is dequantized.
        weights["lm_head.weight"] = _load_tensor(gguf, embed, "lm_head.weight", arch, dtype, True)
    return arch, split_fused(weights, arch)


def _load_tensor(
    gguf: GGUFFile, name: str, hf: str, arch: ArchConfig, dtype: torch.dtype, keep_quantized: bool
):
    info = gguf.tensors[name]
    if info.ggml_type not in SUPPORTED_TYPES:
        raise CheckpointError(gguf.path, f"unsupported tensor type {info.ggml_type.name}", name)
    if keep_quantized and _is_linear(hf) and keeps_quantized(info.ggml_type, info.shape):
        weight = requantize(gguf.raw(name), info.ggml_type, info.shape)
        return weight.map_rows(lambda t: _unpermute(t, hf, arch))
    tensor = dequantize(gguf.raw(name), info.ggml_type, info.shape, dtype)
    return to_hf_norm(_unpermute(tensor, hf, arch), hf, arch)


def _cut(tensor: torch.Tensor, hf: str, arch: ArchConfig, slices) -> torch.Tensor:
    part = None if slices is None else slices(hf, arch)
    if part is None:
        return tensor
    dim, start, stop = part
    return tensor.narrow(dim, start, stop - start).clone()


def _is_linear(hf: str) -> bool:
    return hf == "lm_head.weight" or hf.endswith("_proj.weight")


def _unpermute(tensor: torch.Tensor, hf: str, arch: ArchConfig) -> torch.Tensor:
    if arch.family in PERMUTED_FAMILIES:
        if hf.endswith("self_attn.q_proj.weight") or hf.endswith("self_attn.q_proj.bias"):
            return unpermute_qk(tensor, arch.num_heads)
        if hf.endswith("self_attn.k_proj.weight") or hf.endswith("self_attn.k_proj.bias"):
            return unpermute_qk(tensor, arch.num_kv_heads)
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
