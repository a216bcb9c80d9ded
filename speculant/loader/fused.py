"""Phi-3's fused products split into Llama's: `qkv_proj` rows -> q_proj, k_proj, v_proj and
`gate_up_proj` rows -> gate_proj, up_proj (the gate first), float or quantized alike, so the
Llama model code runs Phi-3 as it is."""

from __future__ import annotations

from speculant.config import ArchConfig
from speculant.loader.validate import FUSED_FAMILIES


def split_fused(weights: dict, arch: ArchConfig) -> dict:
    if arch.family not in FUSED_FAMILIES:
        return weights
    out = dict(weights)
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        qkv = out.pop(p + "self_attn.qkv_proj.weight")
        for name, rows in zip(("q", "k", "v"), _spans((arch.q_size, arch.kv_size, arch.kv_size)), strict=True):
            out[f"{p}self_attn.{name}_proj.weight"] = _rows(qkv, *rows)
        gate_up = out.pop(p + "mlp.gate_up_proj.weight")
        for name, rows in zip(("gate", "up"), _spans((arch.intermediate_size,) * 2), strict=True):
            out[f"{p}mlp.{name}_proj.weight"] = _rows(gate_up, *rows)
    return out


def _spans(sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def _rows(weight, start: int, stop: int):
    """Rows [start, stop) of a [out, in] tensor or a quantized layout (`speculant.layers.quant`)."""
    if hasattr(weight, "map_rows"):
        return weight.map_rows(lambda t: t[start:stop].clone())
    return weight[start:stop].clone()
