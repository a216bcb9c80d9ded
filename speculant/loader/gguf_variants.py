"""GGUF files of the Llama-shaped variants, as llama.cpp's converter writes them (`qwen3`,
`gemma3`, `phi3`): their ArchConfig fields, the tensor names whose meaning differs by family, and
Gemma's norm weights, which the converter stores plus one (ggml multiplies by the weight alone).

What the converter does not store is what llama.cpp assumes for the architecture: Gemma 3's
sliding layers are five of every six (unless `attention.sliding_window_pattern` says otherwise),
their RoPE base 10,000 (unless `rope.freq_base_swa`), the attention scale 1/sqrt(key_length), or
1/sqrt(hidden / heads) for the 62-layer (27B) model (unless `attention.scale`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from speculant.config import ArchConfig
from speculant.loader.errors import CheckpointError
from speculant.loader.gguf_file import GGUFFile

FAMILIES = {"qwen3": "qwen3", "gemma3": "gemma3", "phi3": "phi3"}
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
LAYER_NAMES = {
    "gemma3": QK_NORMS | {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "qwen3": QK_NORMS,
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},  # fused, split on load
}  # fmt: skip
_GEMMA_PATTERN, _GEMMA_LOCAL_THETA, _GEMMA_27B_LAYERS = 6, 10000.0, 62


def variant_fields(gguf: GGUFFile, family: str, get: Callable[[str, Any], Any]) -> dict[str, Any]:
    """`get(key, default)` reads `{architecture}.{key}`."""
    if family == "qwen3":
        return {"qk_norm": True}
    if family == "phi3":
        hidden, heads = int(get("embedding_length", None)), int(get("attention.head_count", None))
        if int(get("rope.dimension_count", hidden // heads)) != hidden // heads:
            raise CheckpointError(gguf.path, "partial rotary embeddings (phi3.rope.dimension_count below the head size) are not supported")
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            if name in gguf.tensors:
                raise CheckpointError(gguf.path, "longrope scaling (Phi-3 long-context) is not supported", name)
        return {}
    if family == "gemma3":
        return _gemma3(gguf, get)
    return {}


def _gemma3(gguf: GGUFFile, get: Callable[[str, Any], Any]) -> dict[str, Any]:
    if get("attn_logit_softcapping", 0.0):
        raise CheckpointError(gguf.path, "attention logit soft-capping is not supported (gemma3.attn_logit_softcapping)")
    hidden, heads, layers = int(get("embedding_length", None)), int(get("attention.head_count", None)), int(get("block_count", None))
    head_dim = int(get("attention.key_length", hidden // heads))
    scale = get("attention.scale", 0.0)
    scalar = float(scale) ** -2 if scale else float(hidden // heads if layers == _GEMMA_27B_LAYERS else head_dim)
    pattern = int(get("attention.sliding_window_pattern", _GEMMA_PATTERN))
    softcap = get("final_logit_softcapping", 0.0)
    return dict(
        qk_norm=True,
        hidden_act="gelu_tanh",
        sandwich_norms=True,
        norm_weight_offset=1.0,
        embed_scale=hidden**0.5,
        query_pre_attn_scalar=scalar,
        final_logit_softcap=float(softcap) if softcap else None,
        sliding_window=int(get("attention.sliding_window", None)),
        sliding_layers=tuple(i for i in range(layers) if (i + 1) % pattern),
        local_rope_theta=float(get("rope.freq_base_swa", _GEMMA_LOCAL_THETA)),
    )


def to_hf_norm(tensor: torch.Tensor, hf: str, arch: ArchConfig) -> torch.Tensor:
    """A norm weight as the checkpoint's own config means it: minus the converter's offset."""
    if arch.norm_weight_offset and hf.endswith(("norm.weight", "layernorm.weight")):
        return tensor - arch.norm_weight_offset
    return tensor
