"""ArchConfig from a GGUF file's metadata, and GGUF tensor names -> Hugging Face names."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from speculant.config import ArchConfig, RopeScaling
from speculant.loader.errors import CheckpointError
from speculant.loader.generation import gguf_eos_ids
from speculant.loader.gguf_file import GGUFFile
from speculant.loader.gguf_variants import FAMILIES as VARIANT_FAMILIES
from speculant.loader.gguf_variants import LAYER_NAMES as VARIANT_LAYER_NAMES
from speculant.loader.gguf_variants import variant_fields

# general.architecture -> ArchConfig.family. llama.cpp writes Mistral 7B as "llama".
_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", **VARIANT_FAMILIES}

# Families whose q/k rows llama.cpp's converter permuted (see `unpermute_qk`).
PERMUTED_FAMILIES = frozenset({"llama", "mistral"})

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str, family: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor of `family`, or None for tensors we do not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _LAYER_NAMES | VARIANT_LAYER_NAMES.get(family, {})
    match = _LAYER_PATTERN.fullmatch(gguf_name)
    if match is None or match.group(2) not in names:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"


def arch_config(gguf: GGUFFile) -> ArchConfig:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in _FAMILIES:
        raise CheckpointError(
            gguf.path, f"unsupported architecture {arch!r}; supported: {sorted([*_FAMILIES, 'deepseek2'])}"
        )

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(gguf.path, f"metadata key {arch}.{key} is missing")
        return value

    hidden, num_heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    rope_theta = float(get("rope.freq_base", 10000.0))
    embed = gguf.tensors.get("token_embd.weight")
    vocab_default = len(meta.get("tokenizer.ggml.tokens", ())) or (
        embed.shape[0] if embed else None
    )
    return ArchConfig(
        family=_FAMILIES[arch],
        vocab_size=int(get("vocab_size", vocab_default)),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=_rope_scaling(gguf, arch, rope_theta, head_dim),
        max_position=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias=_FAMILIES[arch] == "qwen2" or "blk.0.attn_q.bias" in gguf.tensors,
        bos_token_id=_optional_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_optional_int(meta.get("tokenizer.ggml.eos_token_id")),
        eos_token_ids=gguf_eos_ids(gguf.metadata, gguf.path),
        **variant_fields(gguf, _FAMILIES[arch], get),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _rope_scaling(gguf: GGUFFile, arch: str, rope_theta: float, head_dim: int) -> RopeScaling:
    if "rope_freqs.weight" in gguf.tensors:
        return _llama3_from_factors(gguf, rope_theta, head_dim)
    meta = lambda key, default=None: gguf.metadata.get(f"{arch}.rope.scaling.{key}", default)  # noqa: E731
    kind = meta("type", "none")
    if kind == "none":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(meta("factor", 1.0)))
    if kind == "yarn":  # llama.cpp's defaults where the converter wrote no beta
        return RopeScaling(
            kind="yarn", factor=float(meta("factor", 1.0)), original_max_position=int(meta("original_context_length", 0)),
            beta_fast=float(meta("yarn_beta_fast", 32.0)), beta_slow=float(meta("yarn_beta_slow", 1.0)), mscale=0.0,
        )  # fmt: skip
    raise CheckpointError(gguf.path, f"unsupported rope scaling type {kind!r} (supported: none, linear, yarn, llama3 by rope_freqs)")


def _llama3_from_factors(gguf: GGUFFile, rope_theta: float, head_dim: int) -> RopeScaling:
    """Recover Llama-3 rope scaling from the per-frequency divisors llama.cpp stores instead.

    The converter keeps only `rope_freqs` (one divisor per rotary frequency), not the parameters.
    The largest divisor is `factor`; the others follow from Llama 3.1's published low/high
    frequency factors and original context, which we check by recomputing every divisor.
    """
    stored = np.frombuffer(gguf.raw("rope_freqs.weight").tobytes(), dtype=np.float32)
    scaling = RopeScaling(kind="llama3", factor=float(stored.max()))
    if not np.allclose(_llama3_divisors(scaling, rope_theta, head_dim), stored, rtol=1e-4):
        raise CheckpointError(
            gguf.path, "rope_freqs do not match Llama-3 scaling", "rope_freqs.weight"
        )
    return scaling


def _llama3_divisors(scaling: RopeScaling, rope_theta: float, head_dim: int) -> np.ndarray:
    freqs = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    ratio = scaling.original_max_position / wavelen
    smooth = (ratio - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    divisors = 1.0 / ((1 - smooth) / scaling.factor + smooth)
    divisors = np.where(ratio < scaling.low_freq_factor, scaling.factor, divisors)
    return np.where(ratio > scaling.high_freq_factor, 1.0, divisors)
