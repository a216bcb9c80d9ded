"""The canonical weight names and shapes an ArchConfig implies, and the check against them."""

from __future__ import annotations

import pathlib

import torch

from speculant.config import ArchConfig
from speculant.loader.errors import CheckpointError

FUSED_FAMILIES = frozenset({"phi3"})  # q/k/v and gate/up stored fused, as qkv_proj and gate_up_proj


def expected_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face Llama/Qwen2 name -> shape ([out, in] for linear weights)."""
    hidden, inter = arch.hidden_size, arch.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, hidden)}
    for i in range(arch.num_layers):
        prefix = f"model.layers.{i}."
        shapes |= {
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (arch.q_size, hidden),
            prefix + "self_attn.k_proj.weight": (arch.kv_size, hidden),
            prefix + "self_attn.v_proj.weight": (arch.kv_size, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, arch.q_size),
            prefix + "post_attention_layernorm.weight": (hidden,),
            prefix + "mlp.gate_proj.weight": (inter, hidden),
            prefix + "mlp.up_proj.weight": (inter, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inter),
        }
        shapes |= _variant_shapes(arch, prefix)
        if arch.attention_bias:
            shapes |= {
                prefix + "self_attn.q_proj.bias": (arch.q_size,),
                prefix + "self_attn.k_proj.bias": (arch.kv_size,),
                prefix + "self_attn.v_proj.bias": (arch.kv_size,),
            }
    if arch.family in FUSED_FAMILIES:
        separate = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        shapes = {name: shape for name, shape in shapes.items() if name.rsplit(".", 2)[-2] not in separate}
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    return shapes


def _variant_shapes(arch: ArchConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """A layer's tensors beyond Llama's: q/k norms, Gemma's extra norms, Phi-3's fused products
    (in place of the separate ones; `speculant.loader.fused` splits them after loading)."""
    hidden, shapes = arch.hidden_size, {}
    if arch.qk_norm:
        shapes |= {prefix + "self_attn.q_norm.weight": (arch.head_dim,), prefix + "self_attn.k_norm.weight": (arch.head_dim,)}
    if arch.sandwich_norms:
        shapes |= {prefix + f"{name}.weight": (hidden,) for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm")}
    if arch.family in FUSED_FAMILIES:
        return shapes | {
            prefix + "self_attn.qkv_proj.weight": (arch.q_size + 2 * arch.kv_size, hidden),
            prefix + "mlp.gate_up_proj.weight": (2 * arch.intermediate_size, hidden),
        }
    return shapes


def check_shapes(
    arch: ArchConfig, shapes: dict[str, tuple[int, ...]], path: pathlib.Path
) -> dict[str, tuple[int, ...]]:
    """The expected names present in `shapes`; raises if one is missing or has the wrong shape.

    `lm_head.weight` may be absent only with tied embeddings; names we do not use are left out.
    """
    expected = expected_shapes(arch)
    if arch.tie_word_embeddings and "lm_head.weight" not in shapes:
        del expected["lm_head.weight"]
    for name, shape in expected.items():
        if name not in shapes:
            raise CheckpointError(path, "missing tensor", name)
        if tuple(shapes[name]) != shape:
            raise CheckpointError(path, f"shape {tuple(shapes[name])} != expected {shape}", name)
    return {name: tuple(shapes[name]) for name in expected}


def tensor_shapes(weights: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in weights.items()}
