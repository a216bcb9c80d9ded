"""Hugging Face checkpoint folders: config.json + safetensors (single file or sharded)."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import torch
from safetensors import SafetensorError

from speculant.config import ArchConfig, RopeScaling
from speculant.loader.errors import CheckpointError
from speculant.loader.files import open_safetensors, read_json
from speculant.loader.fused import split_fused
from speculant.loader.generation import eos_ids, hf_generation_config
from speculant.loader.hf_variants import split_rope, variant_fields
from speculant.loader.validate import FUSED_FAMILIES, check_shapes

_FAMILIES = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "deepseek_v3": "deepseek_v3",
    "qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3",
}  # fmt: skip
_PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_INDEX = "model.safetensors.index.json"


def load_hf_config(folder: pathlib.Path) -> ArchConfig:
    """config.json's architecture, with generation_config.json's EOS ids and sampling defaults."""
    arch = arch_from_hf_config(read_json(folder / "config.json"), folder)
    eos, defaults = hf_generation_config(folder)
    return dataclasses.replace(arch, eos_token_ids=tuple(dict.fromkeys(arch.eos_token_ids + eos)), generation=defaults)


def arch_from_hf_config(config: dict[str, Any], folder: pathlib.Path = pathlib.Path(".")) -> ArchConfig:
    """ArchConfig from a config.json dict (`folder` names the file in errors)."""
    family = _FAMILIES.get(config.get("model_type", ""))
    if family is None:
        raise CheckpointError(
            folder / "config.json", f"unsupported model_type {config.get('model_type')!r}"
        )
    hidden, num_heads = config["hidden_size"], config["num_attention_heads"]
    rope, local_rope = split_rope(family, _rope_parameters(config))
    eos = eos_ids(config.get("eos_token_id"), folder / "config.json")
    arch = ArchConfig(
        family=family,
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or hidden // num_heads,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=_rope_scaling(rope, folder / "config.json"),
        max_position=config.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
        bos_token_id=_first_id(config.get("bos_token_id")),
        eos_token_id=eos[0] if eos else None,
        eos_token_ids=eos,
        **variant_fields(family, config, local_rope, folder / "config.json"),
    )
    if family == "deepseek_v3":
        from speculant.loader.deepseek import deepseek_arch

        return deepseek_arch(arch, config, folder / "config.json")
    return arch


def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes one `rope_parameters` dict; older configs write `rope_theta` and
    `rope_scaling` side by side. Both become one dict in the newer spelling."""
    if isinstance(config.get("rope_parameters"), dict):
        return config["rope_parameters"]
    merged = dict(config.get("rope_scaling") or {})
    if "rope_theta" in config:
        merged["rope_theta"] = config["rope_theta"]
    return merged


def _rope_scaling(rope: dict[str, Any], path: pathlib.Path) -> RopeScaling:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    if kind == "yarn":
        return RopeScaling(
            kind="yarn",
            factor=float(rope["factor"]),
            original_max_position=int(rope["original_max_position_embeddings"]),
            beta_fast=float(rope.get("beta_fast") or 32),
            beta_slow=float(rope.get("beta_slow") or 1),
            mscale=float(rope.get("mscale") or 0),
            mscale_all_dim=float(rope.get("mscale_all_dim") or 0),
        )
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(rope["factor"]))
    if kind != "llama3":
        raise CheckpointError(
            path, f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3, yarn)"
        )
    defaults = RopeScaling(kind="llama3")
    return RopeScaling(
        kind="llama3",
        factor=float(rope.get("factor", defaults.factor)),
        low_freq_factor=float(rope.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(rope.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position=int(
            rope.get("original_max_position_embeddings", defaults.original_max_position)
        ),
    )


def _first_id(value: int | list[int] | None) -> int | None:
    """The first of several BOS ids a config may list."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def load_hf_weights(
    folder: pathlib.Path,
    arch: ArchConfig,
    dtype: torch.dtype,
    slices: Callable[[str], tuple[int, int, int] | None] | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor the model needs; `slices(name)` -> (dim, start, stop) reads only that part
    of a tensor from the file (a tensor-parallel rank's shard), None the whole tensor."""
    if slices is not None and not (arch.family != "deepseek_v3" and arch.is_llama_layer and arch.family not in FUSED_FAMILIES):
        raise CheckpointError(folder, f"sliced loading (tensor parallelism) covers the Llama family only, not {arch.family}")
    if arch.family == "deepseek_v3":
        from speculant.loader.deepseek import load_deepseek_weights

        return load_deepseek_weights(folder, _weight_files(folder), arch, dtype)
    by_file: dict[pathlib.Path, list[str]] = {}
    for name, path in _weight_files(folder).items():
        by_file.setdefault(path, []).append(name)
    shapes: dict[str, tuple[int, ...]] = {}
    for path, names in by_file.items():
        shapes |= _shapes(path, names)
    wanted = check_shapes(arch, shapes, folder)
    weights: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        weights |= _read_tensors(path, [name for name in names if name in wanted], dtype, slices)
    return split_fused(weights, arch)


def _weight_files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    if (folder / _INDEX).exists():
        weight_map = read_json(folder / _INDEX).get("weight_map", {})
        return {name: folder / shard for name, shard in weight_map.items()}
    single = sorted(folder.glob("*.safetensors"))
    if not single:
        pickled = [p.name for pattern in _PICKLED for p in folder.glob(pattern)]
        problem = "no *.safetensors weights"
        if pickled:
            problem += (
                f"; refusing pickled weights {pickled} (unpickling can run code): convert them"
            )
        raise CheckpointError(folder, problem)
    if len(single) > 1:
        raise CheckpointError(
            folder, f"several safetensors files {[p.name for p in single]} but no {_INDEX}"
        )
    with open_safetensors(single[0]) as f:
        return {name: single[0] for name in f.keys()}


def _shapes(path: pathlib.Path, names: list[str]) -> dict[str, tuple[int, ...]]:
    with open_safetensors(path) as f:
        present = set(f.keys())
        for name in names:
            if name not in present:
                raise CheckpointError(path, "tensor listed in the index is not in the file", name)
        return {name: tuple(f.get_slice(name).get_shape()) for name in names}


def _read_tensors(
    path: pathlib.Path, names: list[str], dtype: torch.dtype, slices=None
) -> dict[str, torch.Tensor]:
    with open_safetensors(path) as f:
        try:
            return {name: _read(f, name, slices(name) if slices else None).to(dtype) for name in names}
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(path, f"cannot read tensors ({exc})") from None


def _read(f, name: str, part: tuple[int, int, int] | None) -> torch.Tensor:
    if part is None:
        return f.get_tensor(name)
    dim, start, stop = part
    return f.get_slice(name)[(slice(None),) * dim + (slice(start, stop),)]
