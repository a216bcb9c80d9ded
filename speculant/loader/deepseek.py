"""DeepSeek-V3 checkpoints in Hugging Face layout: the architecture's MLA and MoE settings, and
the weights read shard by shard (FP8 block-scaled weights dequantized with their
`weight_scale_inv` as they are read), the first MTP module's included."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch

from speculant.config import ArchConfig, MlaConfig, MoeConfig
from speculant.loader.errors import CheckpointError
from speculant.loader.files import open_safetensors, read_json

_SCALE = "_scale_inv"
_FP32 = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")  # the router stays in float32
_SHARED = ("embed_tokens.weight", "shared_head.head.weight")  # an MTP module's copies of the target's


def deepseek_arch(arch: ArchConfig, config: dict[str, Any], path: pathlib.Path) -> ArchConfig:
    """`arch` (the common fields read as for Llama) with DeepSeek-V3's own."""
    if config.get("attention_bias"):
        raise CheckpointError(path, "attention_bias: DeepSeek-V3 projections with biases are not supported")
    try:
        mla = MlaConfig(
            kv_lora_rank=config["kv_lora_rank"],
            q_lora_rank=config.get("q_lora_rank"),
            qk_nope_head_dim=config["qk_nope_head_dim"],
            qk_rope_head_dim=config["qk_rope_head_dim"],
            v_head_dim=config["v_head_dim"],
            rope_interleave=bool(config.get("rope_interleave", True)),
        )
        moe = MoeConfig(
            num_experts=config["n_routed_experts"],
            experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["moe_intermediate_size"],
            num_shared_experts=config.get("n_shared_experts") or 0,
            num_groups=config.get("n_group") or 1,
            topk_groups=config.get("topk_group") or 1,
            routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(config.get("norm_topk_prob", True)),
            first_dense_layers=config.get("first_k_dense_replace") or 0,
        )
    except KeyError as exc:
        raise CheckpointError(path, f"missing DeepSeek-V3 field {exc.args[0]!r}") from None
    if config.get("scoring_func", "sigmoid") != "sigmoid" or config.get("topk_method", "noaux_tc") != "noaux_tc":
        raise CheckpointError(path, "only sigmoid scoring with noaux_tc (bias-corrected) top-k routing is supported")
    return dataclasses.replace(
        arch, head_dim=mla.qk_rope_head_dim, mla=mla, moe=moe, mtp_layers=int(config.get("num_nextn_predict_layers") or 0)
    )


def load_deepseek_weights(
    folder: pathlib.Path, files: dict[str, pathlib.Path], arch: ArchConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Every tensor of the model's layers and of its first MTP module, read one shard at a time."""
    block = tuple(read_json(folder / "config.json").get("quantization_config", {}).get("weight_block_size", (128, 128)))
    wanted = [n for n in files if _wanted(n, arch)]
    _check_present(wanted, arch, folder)
    by_file: dict[pathlib.Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    weights: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with open_safetensors(path) as f:
            for name in names:
                tensor = f.get_tensor(name)
                if name + _SCALE in files:
                    tensor = dequantize_fp8(tensor, _read_one(files[name + _SCALE], name + _SCALE), block)
                weights[name] = tensor.to(torch.float32 if name.endswith(_FP32) else dtype)
    return weights


def _wanted(name: str, arch: ArchConfig) -> bool:
    if name.endswith(_SCALE) or (name.endswith(_SHARED) and ".layers." in name):
        return False
    if not name.startswith("model.layers."):
        return True
    return int(name.split(".")[2]) < arch.num_layers + min(arch.mtp_layers, 1)


def _check_present(names: list[str], arch: ArchConfig, folder: pathlib.Path) -> None:
    present = set(names)
    needed = ["model.embed_tokens.weight", "model.norm.weight"]
    needed += [f"model.layers.{i}.self_attn.kv_b_proj.weight" for i in range(arch.num_layers)]
    for name in needed:
        if name not in present:
            raise CheckpointError(folder, "missing tensor", name)


def _read_one(path: pathlib.Path, name: str) -> torch.Tensor:
    with open_safetensors(path) as f:
        return f.get_tensor(name)


def dequantize_fp8(
    weight: torch.Tensor,  # [out, in] float8
    scale_inv: torch.Tensor,  # [ceil(out / b0), ceil(in / b1)] float32, one per block
    block: tuple[int, int],
) -> torch.Tensor:  # [out, in] float32
    rows, cols = weight.shape
    scale = scale_inv.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * scale
