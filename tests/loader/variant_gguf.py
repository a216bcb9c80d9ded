"""What llama.cpp's converter writes differently for Qwen3, Gemma 3 and Phi-3 (the GGUF writer in
conftest.py calls these): architecture names, tensor names, Gemma's norm weights stored plus one,
and the metadata keys beyond Llama's."""

from __future__ import annotations

import gguf
import torch

GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3"}
_QK_NORMS = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
TENSOR_NAMES = {
    "qwen3": _QK_NORMS,
    "gemma3": _QK_NORMS | {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
}  # fmt: skip


def stored_norm_offset(arch: str, hf: str) -> float:
    """The converter writes Gemma's (1 + w) norms as 1 + w, since ggml scales by the weight alone."""
    return 1.0 if arch == "gemma3" and hf.endswith("norm.weight") else 0.0


def rope_theta(config) -> float:
    rope = config.rope_parameters
    return (rope.get("full_attention") or rope)["rope_theta"]


def write_variant_metadata(writer: gguf.GGUFWriter, config, arch: str) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch == "gemma3":
        writer.add_sliding_window(config.sliding_window)
        if config.final_logit_softcapping is not None:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)


def reference(stored: torch.Tensor, arch: str, hf: str) -> torch.Tensor:
    """What a loader must give back for a stored tensor: Gemma's norms minus the offset."""
    offset = stored_norm_offset(arch, hf)
    return stored - offset if offset else stored
