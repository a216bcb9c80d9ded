"""Weights of a DeepSeek-V2/V3/R1 GGUF file (llama.cpp's `deepseek2`) under the Hugging Face
names `speculant.models.deepseek_v3` loads, dequantized.

What llama.cpp's converter changed, undone here:
- experts are stacked per layer: `ffn_{gate,up}_exps` [E, I, hidden] become the fused
  `mlp.experts.gate_up_proj` [E, 2I, hidden], `ffn_down_exps` [E, hidden, I] is `down_proj`;
- newer files split `kv_b_proj` [H * (dn + dv), R] into `attn_k_b` [H, R, dn] (transposed, for
  the absorbed product) and `attn_v_b` [H, dv, R]; they are joined back;
- the MTP layers (`nextn_predict_layers`) are blocks after the last, with `nextn.*` tensors.
The RoPE rows are stored as in the HF checkpoint (ggml rotates adjacent pairs, as DeepSeek does),
so no permutation is undone. Quantized tensors are dequantized: MoE experts are not kept quantized.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from speculant.config import ArchConfig
from speculant.loader.dequant import SUPPORTED_TYPES, dequantize
from speculant.loader.errors import CheckpointError
from speculant.loader.gguf_deepseek_arch import deepseek2_arch
from speculant.loader.gguf_file import GGUFFile

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF `blk.{i}.{part}` -> HF name under `model.layers.{i}.`, for tensors read as they are.
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "nextn.eh_proj.weight": "eh_proj.weight",
    "nextn.enorm.weight": "enorm.weight",
    "nextn.hnorm.weight": "hnorm.weight",
    "nextn.shared_head_norm.weight": "shared_head.norm.weight",
}
# Tensors built from two GGUF tensors: HF name -> the GGUF parts, in the order `_join` takes them.
_JOINED = {
    "mlp.experts.gate_up_proj": ("ffn_gate_exps.weight", "ffn_up_exps.weight"),
    "self_attn.kv_b_proj.weight": ("attn_k_b.weight", "attn_v_b.weight"),
}
_PART_OF = {part: hf for hf, parts in _JOINED.items() for part in parts}
_SKIPPED = frozenset({"nextn.embed_tokens.weight", "nextn.shared_head_head.weight"})  # an MTP layer's copies of the target's
_FP32 = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")  # the router stays in float32
_NAME = re.compile(r"blk\.(\d+)\.([\w.]+)")


def load_deepseek_gguf(gguf: GGUFFile, dtype: torch.dtype) -> tuple[ArchConfig, dict[str, torch.Tensor]]:
    arch = deepseek2_arch(gguf)
    sources = _sources(gguf)
    # Shapes are checked from the tensor infos, on meta tensors, before any data is read.
    _check_shapes(gguf, arch, sources)
    return arch, {hf: _load(gguf, hf, names, dtype) for hf, names in sources.items()}


def _sources(gguf: GGUFFile) -> dict[str, tuple[str, ...]]:
    """HF name -> the GGUF tensor(s) it is made of; unknown tensors are refused."""
    sources: dict[str, tuple[str, ...]] = {}
    joined: dict[str, dict[str, str]] = {}
    for name in gguf.tensors:
        if name in _GLOBAL:
            sources[_GLOBAL[name]] = (name,)
            continue
        match = _NAME.fullmatch(name)
        layer, part = (match.group(1), match.group(2)) if match else (None, None)
        if part in _LAYER:
            sources[f"model.layers.{layer}.{_LAYER[part]}"] = (name,)
        elif part in _PART_OF:
            joined.setdefault(f"model.layers.{layer}.{_PART_OF[part]}", {})[part] = name
        elif part not in _SKIPPED:
            raise CheckpointError(gguf.path, "unknown tensor: not part of llama.cpp's deepseek2 layout", name)
    for hf, found in joined.items():
        wanted = _JOINED[hf.split(".", 3)[3]]
        missing = [p for p in wanted if p not in found]
        if missing:
            layer = hf.split(".")[2]
            raise CheckpointError(gguf.path, f"missing tensor (needed with {next(iter(found.values()))})", f"blk.{layer}.{missing[0]}")
        if hf in sources:  # attn_kv_b and attn_k_b/attn_v_b both present: the same weights twice
            continue
        sources[hf] = tuple(found[p] for p in wanted)
    return sources


def _check_shapes(gguf: GGUFFile, arch: ArchConfig, sources: dict[str, tuple[str, ...]]) -> None:
    for hf, shape in expected_shapes(arch).items():
        if hf not in sources:
            raise CheckpointError(gguf.path, f"missing tensor (for {hf})", gguf_name_of(hf))
        names = sources[hf]
        try:
            found = tuple(_join(hf, [torch.empty(gguf.tensors[n].shape, device="meta") for n in names]).shape)
        except RuntimeError:
            found = None
        if found != shape:
            shapes = " and ".join(str(gguf.tensors[n].shape) for n in names)
            raise CheckpointError(gguf.path, f"shape {shapes} does not give the expected {shape} of {hf}", names[0])


def _load(gguf: GGUFFile, hf: str, names: tuple[str, ...], dtype: torch.dtype) -> torch.Tensor:
    tensors = []
    for name in names:
        info = gguf.tensors[name]
        if info.ggml_type not in SUPPORTED_TYPES:
            raise CheckpointError(gguf.path, f"unsupported tensor type {info.ggml_type.name}", name)
        tensors.append(dequantize(gguf.raw(name), info.ggml_type, info.shape, torch.float32 if hf.endswith(_FP32) else dtype))
    return _join(hf, tensors)


def _join(hf: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    if hf.endswith("experts.gate_up_proj"):  # [E, I, hidden] twice -> [E, 2I, hidden]
        return torch.cat(tensors, dim=1)
    if hf.endswith("kv_b_proj.weight") and len(tensors) == 2:
        k_b, v_b = tensors  # [H, R, dn] (k_b transposed by the converter), [H, dv, R]
        kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1)  # [H, dn + dv, R]
        return kv_b.reshape(-1, kv_b.shape[-1])
    (tensor,) = tensors
    return tensor


def expected_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor a `deepseek2` file must give: the layers (dense, then
    MoE), the embedding, the final norm, `lm_head` unless tied, and the MTP layer's."""
    from speculant.models.deepseek_v3 import mtp_layer_shapes

    h = arch.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, h), "model.norm.weight": (h,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    dense = dataclasses.replace(arch, moe=None)
    for i in range(arch.num_layers + arch.mtp_layers):
        layer = mtp_layer_shapes(dense if i < arch.moe.first_dense_layers else arch)
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
        if i >= arch.num_layers:
            extra = {"enorm.weight": (h,), "hnorm.weight": (h,), "eh_proj.weight": (h, 2 * h), "shared_head.norm.weight": (h,)}
            shapes |= {f"model.layers.{i}.{name}": shape for name, shape in extra.items()}
    return shapes


def gguf_name_of(hf: str) -> str:
    """The GGUF tensor name llama.cpp's converter gives an HF name (of joined ones, the first)."""
    found = [gguf for gguf, name in _GLOBAL.items() if name == hf]
    if found:
        return found[0]
    _, _, layer, rest = hf.split(".", 3)
    part = next((gguf for gguf, name in _LAYER.items() if name == rest), None) or _JOINED[rest][0]
    return f"blk.{layer}.{part}"
