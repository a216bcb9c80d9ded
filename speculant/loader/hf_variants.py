"""config.json fields of the Llama-shaped families beyond Llama's own (`ArchConfig`'s variant
fields): Qwen3's q/k norms, Gemma 3's GeGLU, sandwich norms, embedding scale, attention scalar,
sliding-window layers and their own RoPE base, Phi-3's checks. Anything a family sets that the
model does not implement is a `CheckpointError` naming the field."""

from __future__ import annotations

import pathlib
from typing import Any

from speculant.loader.errors import CheckpointError

_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
GEMMA_SLIDING_PATTERN = 6  # Gemma 3: five sliding layers, then a full one, when config.json lists no layer_types


def variant_fields(family: str, config: dict[str, Any], rope: dict[str, Any], path: pathlib.Path) -> dict[str, Any]:
    """ArchConfig keywords for `family` beyond the Llama ones; `rope` is the sliding layers' RoPE
    dict where the family has one (Gemma 3's `rope_parameters["sliding_attention"]`)."""
    if family == "qwen3":
        return {"qk_norm": True}
    if family == "phi3":
        _refuse(config, path, partial_rotary_factor=1.0)
        return {}
    if family == "gemma3":
        return _gemma3(config, rope, path)
    return {}


def _gemma3(config: dict[str, Any], local_rope: dict[str, Any], path: pathlib.Path) -> dict[str, Any]:
    _refuse(config, path, attn_logit_softcapping=None, use_bidirectional_attention=False)
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _ACTIVATIONS:
        raise CheckpointError(path, f"unsupported hidden_activation {act!r} (supported: {sorted(_ACTIVATIONS)})")
    if local_rope.get("rope_type", "default") != "default":
        raise CheckpointError(path, f"unsupported rope_type {local_rope['rope_type']!r} for the sliding layers")
    num_layers = config["num_hidden_layers"]
    pattern = config.get("sliding_window_pattern") or GEMMA_SLIDING_PATTERN
    layer_types = config.get("layer_types") or [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)
    ]
    if len(layer_types) != num_layers or set(layer_types) - {"full_attention", "sliding_attention"}:
        raise CheckpointError(path, f"layer_types must list full_attention/sliding_attention for each of {num_layers} layers")
    return dict(
        qk_norm=True,
        hidden_act=_ACTIVATIONS[act],
        sandwich_norms=True,
        norm_weight_offset=1.0,
        embed_scale=config["hidden_size"] ** 0.5,
        query_pre_attn_scalar=float(config.get("query_pre_attn_scalar") or 256),
        final_logit_softcap=config.get("final_logit_softcapping"),
        sliding_window=config.get("sliding_window"),
        sliding_layers=tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention"),
        local_rope_theta=float(local_rope.get("rope_theta") or config.get("rope_local_base_freq") or 10000.0),
    )


def split_rope(family: str, rope: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full layers' RoPE dict, sliding layers' RoPE dict): Gemma 3 keeps one per layer type in
    transformers 5's `rope_parameters`; other families have one for all layers."""
    if family == "gemma3" and isinstance(rope.get("full_attention"), dict):
        return rope["full_attention"], rope.get("sliding_attention") or {}
    return rope, {}


def _refuse(config: dict[str, Any], path: pathlib.Path, **supported: Any) -> None:
    for field, value in supported.items():
        if config.get(field) not in (None, value):
            raise CheckpointError(path, f"unsupported {field} {config[field]!r} (supported: {value!r})")
