"""ArchConfig of a DeepSeek-V2/V3/R1 GGUF file: llama.cpp's `deepseek2` architecture metadata.

llama.cpp's converter writes MLA as multi-query attention over the latent: `attention.key_length`
= kv_lora_rank + qk_rope_head_dim and `value_length` = kv_lora_rank, with the per-head sizes in
`key_length_mla` (qk_nope + qk_rope) and `value_length_mla` (v_head_dim). Files converted before
that change carry the per-head sizes in `key_length` / `value_length` and no `*_mla` keys.

YaRN: the converter keeps `factor`, `original_context_length`, the betas, and DeepSeek's
`mscale_all_dim` premultiplied by 0.1 as `yarn_log_multiplier`; it drops `mscale`. llama.cpp then
runs with mscale = mscale_all_dim (so the cos/sin amplitude is 1), which is what every released
DeepSeek-V2/V3 config says, and we read it the same way.
"""

from __future__ import annotations

from typing import Any

from speculant.config import ArchConfig, MlaConfig, MoeConfig, RopeScaling
from speculant.loader.errors import CheckpointError
from speculant.loader.generation import gguf_eos_ids
from speculant.loader.gguf_file import GGUFFile

ARCH = "deepseek2"
_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (1 is softmax)
_REQUIRED = object()


class _Metadata:
    """`deepseek2.*` keys of one file; a missing required key is a CheckpointError naming it."""

    def __init__(self, gguf: GGUFFile):
        self.gguf, self.meta = gguf, gguf.metadata

    def __call__(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.meta.get(f"{ARCH}.{key}")
        if value is not None:
            return value
        if default is _REQUIRED:
            raise CheckpointError(self.gguf.path, f"metadata key {ARCH}.{key} is missing")
        return default

    def has(self, key: str) -> bool:
        return f"{ARCH}.{key}" in self.meta


def deepseek2_arch(gguf: GGUFFile) -> ArchConfig:
    get = _Metadata(gguf)
    mla, moe = _mla(get), _moe(get)
    mtp_layers = int(get("nextn_predict_layers", 0))
    num_heads = int(get("attention.head_count"))
    embed = gguf.tensors.get("token_embd.weight")
    vocab = len(gguf.metadata.get("tokenizer.ggml.tokens", ())) or (embed.shape[0] if embed else None)
    return ArchConfig(
        family="deepseek_v3",
        vocab_size=int(get("vocab_size", vocab)),
        hidden_size=int(get("embedding_length")),
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")) - mtp_layers,  # MTP layers are counted as blocks
        num_heads=num_heads,
        num_kv_heads=num_heads,  # MLA: every head reads the shared latent
        head_dim=mla.qk_rope_head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(get),
        max_position=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        bos_token_id=_optional_int(gguf.metadata.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_optional_int(gguf.metadata.get("tokenizer.ggml.eos_token_id")),
        eos_token_ids=gguf_eos_ids(gguf.metadata, gguf.path),
        mla=mla,
        moe=moe,
        mtp_layers=mtp_layers,
    )


def _mla(get: _Metadata) -> MlaConfig:
    rope = int(get("rope.dimension_count"))
    if get.has("attention.key_length_mla"):
        qk_head, v_head = int(get("attention.key_length_mla")), int(get("attention.value_length_mla"))
    else:
        qk_head, v_head = int(get("attention.key_length")), int(get("attention.value_length"))
    q_lora = get("attention.q_lora_rank", None)
    return MlaConfig(
        kv_lora_rank=int(get("attention.kv_lora_rank")),
        q_lora_rank=int(q_lora) if q_lora else None,
        qk_nope_head_dim=qk_head - rope,
        qk_rope_head_dim=rope,
        v_head_dim=v_head,
        rope_interleave=True,  # ggml's rope rotates adjacent pairs; the converter keeps HF's rows
    )


def _moe(get: _Metadata) -> MoeConfig:
    # llama.cpp reads an absent gating function as softmax (DeepSeek-V2 files); we route by sigmoid only.
    gating = int(get("expert_gating_func", 1))
    if gating != _SIGMOID:
        raise CheckpointError(
            get.gguf.path,
            f"{ARCH}.expert_gating_func = {gating}: only sigmoid expert scoring (DeepSeek-V3/R1, value 2) is supported",
        )
    return MoeConfig(
        num_experts=int(get("expert_count")),
        experts_per_token=int(get("expert_used_count")),
        expert_intermediate_size=int(get("expert_feed_forward_length")),
        num_shared_experts=int(get("expert_shared_count", 0)),
        num_groups=int(get("expert_group_count", 1)) or 1,
        topk_groups=int(get("expert_group_used_count", 1)) or 1,
        routed_scaling_factor=float(get("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(get("expert_weights_norm", False)),
        first_dense_layers=int(get("leading_dense_block_count", 0)),
    )


def _rope_scaling(get: _Metadata) -> RopeScaling:
    kind = get("rope.scaling.type", "none")
    if kind == "none":
        return RopeScaling()
    if kind != "yarn":
        raise CheckpointError(get.gguf.path, f"{ARCH}.rope.scaling.type {kind!r}: only yarn is supported")
    # Rounded to undo the float32 storage of 0.1 * mscale_all_dim (0.0707 -> 0.707, not 0.70699997).
    mscale_all_dim = round(float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1, 6)
    return RopeScaling(
        kind="yarn",
        factor=float(get("rope.scaling.factor")),
        original_max_position=int(get("rope.scaling.original_context_length")),
        beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
        beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)),
        mscale=mscale_all_dim if mscale_all_dim else 1.0,
        mscale_all_dim=mscale_all_dim,
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
