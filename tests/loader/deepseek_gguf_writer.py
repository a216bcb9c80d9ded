"""Tiny DeepSeek-V3 weights written as llama.cpp's converter writes `deepseek2` GGUF files.

The converter's steps, played here (names from the `gguf` package's own tensor map): experts
stacked per layer as `ffn_{gate,up,down}_exps`; `kv_b_proj` either kept (`attn_kv_b`, older
files, per-head key/value lengths) or split into `attn_k_b` (transposed to [H, R, dn]) and
`attn_v_b` [H, dv, R] with the MQA-view lengths and `*_mla` keys; the router kept in F32; tensors
whose rows do not fill whole blocks fall back to F16; MTP layers as blocks after the last with
`nextn.*` tensors. `write_deepseek_gguf` returns what a correct loader gives back: the stored
values dequantized by `gguf.quants`, in transformers' layout (fused experts, joined kv_b).
"""

from __future__ import annotations

import pathlib

import gguf
import numpy as np
import torch
from conftest import CHAT_TEMPLATE, MERGES, SPECIALS, tiny_vocab
from gguf import MODEL_ARCH, MODEL_TENSOR, TENSOR_NAMES
from gguf import GGMLQuantizationType as QType

_NEXTN = {
    "eh_proj": MODEL_TENSOR.NEXTN_EH_PROJ,
    "enorm": MODEL_TENSOR.NEXTN_ENORM,
    "hnorm": MODEL_TENSOR.NEXTN_HNORM,
    "shared_head.norm": MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
    "shared_head.head": MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD,
    "embed_tokens": MODEL_TENSOR.NEXTN_EMBED_TOKENS,
}


def write_deepseek_gguf(
    config, weights: dict[str, torch.Tensor], out: pathlib.Path, qtype: QType = QType.F32, *,
    split_kv_b: bool = True, mtp_layers: int = 0, tokenizer_pre: str = "gpt2",
) -> dict[str, torch.Tensor]:  # fmt: skip
    """`weights`: HF names in transformers' layout (an MTP layer's at index num_hidden_layers)."""
    writer = gguf.GGUFWriter(out, "deepseek2")
    _metadata(writer, config, split_kv_b, mtp_layers)
    _tokenizer(writer, tokenizer_pre)
    names = gguf.get_tensor_name_map(MODEL_ARCH.DEEPSEEK2, config.num_hidden_layers + mtp_layers)
    expected = {}
    for hf, tensor in weights.items():
        stored = {}
        for gguf_name, part in _converted(config, names, hf, tensor.detach().float(), split_kv_b):
            stored[gguf_name] = _write(writer, gguf_name, part, qtype)
        if stored and not _mtp_copy(config, hf):
            expected[hf] = _joined(hf, list(stored.values()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def _mtp_copy(config, hf: str) -> bool:
    """An MTP layer's copies of the embedding and lm_head, which loaders leave out."""
    mtp = f"model.layers.{config.num_hidden_layers}."
    return hf.startswith(mtp) and hf.endswith(("embed_tokens.weight", "shared_head.head.weight"))


def _converted(config, names, hf: str, t: torch.Tensor, split_kv_b: bool):
    """(GGUF name, tensor) pairs the converter writes for one HF tensor."""
    layer = int(hf.split(".")[2]) if hf.startswith("model.layers.") else None
    if layer is not None and layer >= config.num_hidden_layers:
        rest = hf.split(".", 3)[3].removesuffix(".weight")
        if rest in _NEXTN:
            return [(TENSOR_NAMES[_NEXTN[rest]].format(bid=layer) + ".weight", t)]
    if hf.endswith("experts.gate_up_proj"):
        gate, up = t.chunk(2, dim=1)  # [E, 2I, H] -> [E, I, H] twice, as stacked one expert at a time
        base = hf.removesuffix("gate_up_proj")
        return [(_name(names, base + "gate_proj.weight"), gate), (_name(names, base + "up_proj.weight"), up)]
    if hf.endswith("experts.down_proj"):
        return [(_name(names, hf + ".weight"), t)]
    if hf.endswith("kv_b_proj.weight") and split_kv_b:
        heads, dn, dv = config.num_attention_heads, config.qk_nope_head_dim, config.v_head_dim
        k_b, v_b = t.view(heads, dn + dv, -1).split([dn, dv], dim=1)
        base = hf.removesuffix("kv_b_proj.weight")
        return [(_name(names, base + "k_b_proj.weight"), k_b.transpose(1, 2)), (_name(names, base + "v_b_proj.weight"), v_b)]
    if hf.endswith("e_score_correction_bias"):
        return [(_name(names, hf.replace("e_score_correction_bias", "e_score_correction.bias")), t)]
    return [(_name(names, hf), t)]


def _name(names, hf: str) -> str:
    name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
    assert name is not None and name.endswith((".weight", ".bias")), hf
    return name


def _write(writer, name: str, t: torch.Tensor, qtype: QType) -> torch.Tensor:
    data = t.contiguous().numpy()
    kind = QType.F32 if data.ndim == 1 or name.endswith("ffn_gate_inp.weight") else qtype
    if kind not in (QType.F32, QType.F16) and data.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
        kind = QType.F16  # the converter's fallback for rows that do not fill whole blocks
    stored = data.astype(np.float32) if kind == QType.F32 else gguf.quants.quantize(data, kind)
    writer.add_tensor(name, stored, raw_dtype=None if kind == QType.F32 else kind)
    return torch.from_numpy(gguf.quants.dequantize(stored, kind).reshape(data.shape).copy())


def _joined(hf: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    if hf.endswith("gate_up_proj"):
        return torch.cat(parts, dim=1)
    k_b, v_b = parts
    kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return kv_b.reshape(-1, kv_b.shape[-1])


def _metadata(w: gguf.GGUFWriter, c, split_kv_b: bool, mtp_layers: int) -> None:
    w.add_block_count(c.num_hidden_layers + mtp_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(1 if split_kv_b else c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    _moe(w, c)
    _mla(w, c, split_kv_b)
    _rope(w, c.rope_parameters)
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)


def _moe(w: gguf.GGUFWriter, c) -> None:
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_group_count(c.n_group)
    w.add_expert_group_used_count(c.topk_group)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    if c.norm_topk_prob:
        w.add_expert_weights_norm(True)


def _mla(w: gguf.GGUFWriter, c, split_kv_b: bool) -> None:
    if c.q_lora_rank is not None:
        w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(c.kv_lora_rank)
    if split_kv_b:
        w.add_key_length(c.kv_lora_rank + c.qk_rope_head_dim)
        w.add_value_length(c.kv_lora_rank)
        w.add_key_length_mla(c.qk_nope_head_dim + c.qk_rope_head_dim)
        w.add_value_length_mla(c.v_head_dim)
    else:
        w.add_key_length(c.qk_nope_head_dim + c.qk_rope_head_dim)
        w.add_value_length(c.v_head_dim)
    w.add_rope_dimension_count(c.qk_rope_head_dim)


def _rope(w: gguf.GGUFWriter, rope: dict) -> None:
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") != "yarn":
        return
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _tokenizer(w: gguf.GGUFWriter, pre: str) -> None:
    tokens = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
