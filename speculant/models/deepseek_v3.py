"""DeepSeek-V3 (and R1) in our own code: multi-head latent attention over a compressed paged
cache (`speculant.attention.mla`), mixture-of-experts layers after the first dense ones
(`speculant.layers.moe`), YaRN RoPE with its attention scale, and the checkpoint's own MTP layer
as a draft head.

Weights arrive under Hugging Face names. On load: the q down-projection (or the plain q
projection) and `kv_a_proj_with_mqa` are fused into one product; `kv_b_proj` splits into W_UK
[H, dn, R] and W_UV [H, dv, R]; checkpoints whose RoPE dimensions come in (x0, x1) pairs
(`rope_interleave`) have those rows permuted to the rotate-half layout, which leaves every dot
product, so every logit, unchanged; experts are stacked [E, ...] whether stored one by one
(checkpoint files) or fused (transformers' state dict).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.attention.mla import EXPAND_MIN_QUERIES, mla_attend
from speculant.config import ArchConfig
from speculant.layers.linear import Linear, make_linear
from speculant.layers.moe import MoeWeights, moe_forward
from speculant.layers.rotary import RotaryEmbedding, apply_rotary, yarn_mscale
from speculant.models.base import CausalLM, ForwardContext, HeadBlock
from speculant.models.llama import Attend

LORA_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm keep the default epsilon
Get = Callable[..., torch.Tensor]  # (name, dtype=None) -> the named tensor, ready for use
MakeLinear = Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
MlaAttend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # q_nope, q_rope, row -> [T, H * dv]


@dataclass
class DenseMlp:
    gate_up: Linear  # [hidden] -> [2 * intermediate]
    down: Linear  # [intermediate] -> [hidden]


@dataclass
class MlaLayer:
    input_norm: torch.Tensor  # [hidden]
    qkv_a: Linear  # [hidden] -> [q_lora_rank (or H * (dn + r)) + R + r]
    q_a_norm: torch.Tensor | None  # [q_lora_rank]; None without q LoRA
    q_b: Linear | None  # [q_lora_rank] -> [H * (dn + r)]
    kv_a_norm: torch.Tensor  # [R]
    w_uk: torch.Tensor  # [H, dn, R]
    w_uv: torch.Tensor  # [H, dv, R]
    o: Linear  # [H * dv] -> [hidden]
    post_norm: torch.Tensor  # [hidden]
    mlp: DenseMlp | MoeWeights


class DeepseekV3ForCausalLM(CausalLM):
    attention_backends = ("torch",)  # the absorbed and expanded MLA paths use the torch reference

    def __init__(self, arch: ArchConfig, device: torch.device, dtype: torch.dtype, weights: str = "fp32") -> None:
        if arch.mla is None or arch.moe is None:
            raise ValueError("a deepseek_v3 architecture needs its mla and moe settings")
        self.arch, self.device, self.dtype, self.weights_mode = arch, device, dtype, weights
        self.rotary = RotaryEmbedding(arch, device, dtype)
        self.scale = model_scale(arch)
        self.expand_min_queries = EXPAND_MIN_QUERIES  # tests force one MLA path with 0 or a large value
        self.layers: list[MlaLayer] = []
        self.embed_tokens = self.norm = torch.empty(0)
        self.lm_head: Linear | None = None
        self.mtp_weights: dict[str, torch.Tensor] = {}  # the checkpoint's first MTP module, HF names

    # ---- loading ------------------------------------------------------------------------------

    def load_weights(self, weights: dict) -> None:
        self.embed_tokens = self._get(weights, "model.embed_tokens.weight")
        self.norm = self._get(weights, "model.norm.weight")
        head = weights.get("lm_head.weight")
        self.lm_head = self._linear(self.embed_tokens if head is None or self.arch.tie_word_embeddings else head)
        self.layers = [self._load_layer(weights, f"model.layers.{i}.") for i in range(self.arch.num_layers)]
        mtp = f"model.layers.{self.arch.num_layers}."
        self.mtp_weights = {k: v for k, v in weights.items() if k.startswith(mtp)}

    def _get(self, weights: dict, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        if name not in weights:
            raise KeyError(f"checkpoint lacks tensor {name!r}")
        return weights[name].to(self.device, dtype or self.dtype)

    def _linear(self, weight: torch.Tensor) -> Linear:
        mode = self.weights_mode if self.device.type == "cpu" else ("bf16" if self.weights_mode == "bf16" else "fp32")
        return make_linear(weight.to(self.device), None, mode, self.dtype)

    def _load_layer(self, weights: dict, p: str) -> MlaLayer:
        return load_mla_layer(self.arch, lambda name, dtype=None: self._get(weights, p + name, dtype), self._linear)

    # ---- forward ------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def forward(self, input_ids, positions, ctx: ForwardContext, input_embeds=None, hidden_states=None) -> torch.Tensor:
        if hidden_states is not None:
            raise ValueError("hidden_states: a DeepSeek-V3 decoder takes no hidden-state input (draft heads do)")
        x = self.embed(input_ids) if input_embeds is None else input_embeds  # [T, hidden]
        cos, sin = self.rotary.lookup(positions)
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, ctx)
        return x

    def _layer(self, i: int, w: MlaLayer, x: torch.Tensor, cos, sin, ctx: ForwardContext) -> torch.Tensor:
        def attend(q_nope, q_rope, row):
            return mla_attend(q_nope, q_rope, row, w.w_uk, w.w_uv, ctx.k_cache[i], ctx.backend, ctx.meta, self.scale, self.expand_min_queries)

        return mla_decoder_layer(self.arch, w, x, cos, sin, attend)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden]
        return F.rms_norm(hidden, (self.arch.hidden_size,), self.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.lm_head(self.final_norm(hidden)).float()

    # ---- the MTP module as a draft head ------------------------------------------------------------

    def head_block(self, weights: dict[str, torch.Tensor]) -> HeadBlock:
        layer = self._load_layer(weights, "layer.")

        def block(x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
            cos, sin = self.rotary.lookup(positions)
            return self._layer(0, layer, x, cos, sin, ctx)

        return block

    def own_head_weights(self) -> dict[str, torch.Tensor]:
        if not self.mtp_weights:
            raise ValueError(
                f"the checkpoint has no MTP layer (no model.layers.{self.arch.num_layers}.* tensors); pass head=PATH"
            )
        return self.mtp_weights


# ---- one layer, as functions (the model, its MTP block and head training share them) -----------


def load_mla_layer(arch: ArchConfig, get: Get, linear: MakeLinear) -> MlaLayer:
    """One decoder layer from its Hugging Face names (`get` resolves the layer's prefix); the
    products are whatever `linear` makes (inference kernels, or `F.linear` on trainable tensors)."""
    m, heads = arch.mla, arch.num_heads
    q = get("self_attn.q_b_proj.weight" if m.q_lora_rank else "self_attn.q_proj.weight")
    q = rope_rows(arch, q.view(heads, m.qk_head_dim, -1), m.qk_nope_head_dim).reshape(heads * m.qk_head_dim, -1)
    kv_a = rope_rows(arch, get("self_attn.kv_a_proj_with_mqa.weight"), m.kv_lora_rank)
    kv_b = get("self_attn.kv_b_proj.weight").view(heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    return MlaLayer(
        input_norm=get("input_layernorm.weight"),
        qkv_a=linear(torch.cat([get("self_attn.q_a_proj.weight") if m.q_lora_rank else q, kv_a])),
        q_a_norm=get("self_attn.q_a_layernorm.weight") if m.q_lora_rank else None,
        q_b=linear(q) if m.q_lora_rank else None,
        kv_a_norm=get("self_attn.kv_a_layernorm.weight"),
        w_uk=kv_b[:, : m.qk_nope_head_dim].contiguous(),
        w_uv=kv_b[:, m.qk_nope_head_dim :].contiguous(),
        o=linear(get("self_attn.o_proj.weight")),
        post_norm=get("post_attention_layernorm.weight"),
        mlp=_load_mlp(arch, get, linear),
    )


def rope_rows(arch: ArchConfig, w: torch.Tensor, start: int) -> torch.Tensor:
    """Rows [start:] (the RoPE dims, along dim -2) from (x0, x1) pairs to rotate-half order."""
    if not arch.mla.rope_interleave:
        return w
    r = w.shape[-2] - start
    order = torch.cat([torch.arange(start), start + torch.arange(0, r, 2), start + torch.arange(1, r, 2)]).to(w.device)
    return w.index_select(-2, order)


def _load_mlp(arch: ArchConfig, get: Get, linear: MakeLinear) -> DenseMlp | MoeWeights:
    try:
        router = get("mlp.gate.weight", torch.float32)
    except KeyError:
        return DenseMlp(linear(torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")])), linear(get("mlp.down_proj.weight")))
    gate_up, down = _experts(arch, get)
    shared = lambda name: get(f"mlp.shared_experts.{name}.weight")  # noqa: E731
    return MoeWeights(
        router=router,
        score_bias=get("mlp.gate.e_score_correction_bias", torch.float32),
        gate_up=gate_up,
        down=down,
        shared_gate_up=linear(torch.cat([shared("gate_proj"), shared("up_proj")])),
        shared_down=linear(shared("down_proj")),
    )


def _experts(arch: ArchConfig, get: Get) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, 2I, hidden] and [E, hidden, I], from fused tensors or one expert at a time."""
    try:
        return get("mlp.experts.gate_up_proj"), get("mlp.experts.down_proj")
    except KeyError:
        pass
    one = lambda e, name: get(f"mlp.experts.{e}.{name}.weight")  # noqa: E731
    experts = range(arch.moe.num_experts)
    gate_up = torch.stack([torch.cat([one(e, "gate_proj"), one(e, "up_proj")]) for e in experts])
    return gate_up, torch.stack([one(e, "down_proj") for e in experts])


def mla_decoder_layer(a: ArchConfig, w: MlaLayer, x: torch.Tensor, cos, sin, attend: MlaAttend) -> torch.Tensor:
    """One pre-norm layer over flat tokens x [T, hidden]: MLA (`attend` reads or writes the
    latent rows: paged at inference, expanded in head training), then a dense or MoE MLP."""
    h = F.rms_norm(x, (a.hidden_size,), w.input_norm, a.rms_norm_eps)
    m, heads, num_tokens = a.mla, a.num_heads, h.shape[0]
    qkv = w.qkv_a(h)  # [T, q part + R + r]
    q, latent = qkv[:, : -(m.kv_lora_rank + m.qk_rope_head_dim)], qkv[:, -(m.kv_lora_rank + m.qk_rope_head_dim) :]
    if w.q_b is not None:
        q = w.q_b(F.rms_norm(q, (m.q_lora_rank,), w.q_a_norm, LORA_NORM_EPS))
    q = q.view(num_tokens, heads, m.qk_head_dim)
    q_nope, q_rope = q[..., : m.qk_nope_head_dim], apply_rotary(q[..., m.qk_nope_head_dim :], cos, sin)
    c_kv = F.rms_norm(latent[:, : m.kv_lora_rank], (m.kv_lora_rank,), w.kv_a_norm, LORA_NORM_EPS)
    k_rope = apply_rotary(latent[:, None, m.kv_lora_rank :], cos, sin)[:, 0]
    row = torch.cat([c_kv, k_rope], dim=-1)  # [T, R + r] what the cache keeps
    x = x + w.o(attend(q_nope, q_rope, row))
    h = F.rms_norm(x, (a.hidden_size,), w.post_norm, a.rms_norm_eps)
    if isinstance(w.mlp, DenseMlp):
        gate, up = w.mlp.gate_up(h).chunk(2, dim=-1)
        return x + w.mlp.down(F.silu(gate) * up)
    return x + moe_forward(h, w.mlp, a.moe)


def expanded_attend(a: ArchConfig, w: MlaLayer, attend: Attend) -> MlaAttend:
    """MLA through a plain attention callable `attend(q, k, v)` that scales by 1/sqrt(q's last
    dim) (head training's masked SDPA): per-head keys [W_UK c_kv, k_rope] and values W_UV c_kv,
    the query pre-scaled so the product carries the model's own scale (YaRN's mscale included)."""
    rank, heads = a.mla.kv_lora_rank, a.num_heads
    rescale = model_scale(a) * a.mla.qk_head_dim**0.5

    def run(q_nope: torch.Tensor, q_rope: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        c_kv, k_rope = row[:, :rank], row[:, rank:]
        k_nope = torch.einsum("tr,hdr->thd", c_kv, w.w_uk)  # [T, H, dn]
        values = torch.einsum("tr,hvr->thv", c_kv, w.w_uv)  # [T, H, dv]
        keys = torch.cat([k_nope, k_rope[:, None].expand(-1, heads, -1)], dim=-1)
        return attend(torch.cat([q_nope, q_rope], dim=-1) * rescale, keys, values)

    return run


def model_scale(a: ArchConfig) -> float:
    """The attention scale: 1/sqrt(qk_head_dim), times YaRN's mscale squared when configured."""
    scale = a.mla.qk_head_dim**-0.5
    if a.rope_scaling.kind == "yarn" and a.rope_scaling.mscale_all_dim:
        scale *= yarn_mscale(a.rope_scaling.factor, a.rope_scaling.mscale_all_dim) ** 2
    return scale


def mtp_layer_shapes(a: ArchConfig) -> dict[str, tuple[int, ...]]:
    """A DeepSeek-V3 MTP module's decoder block, by Hugging Face name under `layer.`: MLA and, with
    experts configured, an MoE MLP (experts fused as [E, 2I, hidden] and [E, hidden, I])."""
    m, h, heads = a.mla, a.hidden_size, a.num_heads
    q_out = heads * m.qk_head_dim
    shapes: dict[str, tuple[int, ...]] = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    if m.q_lora_rank:
        shapes |= {"self_attn.q_a_proj.weight": (m.q_lora_rank, h), "self_attn.q_a_layernorm.weight": (m.q_lora_rank,),
                   "self_attn.q_b_proj.weight": (q_out, m.q_lora_rank)}
    else:
        shapes["self_attn.q_proj.weight"] = (q_out, h)
    shapes |= {
        "self_attn.kv_a_proj_with_mqa.weight": (m.kv_lora_rank + m.qk_rope_head_dim, h),
        "self_attn.kv_a_layernorm.weight": (m.kv_lora_rank,),
        "self_attn.kv_b_proj.weight": (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
        "self_attn.o_proj.weight": (h, heads * m.v_head_dim),
    }
    e = a.moe
    if e is None:
        i = a.intermediate_size
        return shapes | {"mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}
    i, shared = e.expert_intermediate_size, e.expert_intermediate_size * e.num_shared_experts
    return shapes | {
        "mlp.gate.weight": (e.num_experts, h), "mlp.gate.e_score_correction_bias": (e.num_experts,),
        "mlp.experts.gate_up_proj": (e.num_experts, 2 * i, h), "mlp.experts.down_proj": (e.num_experts, h, i),
        "mlp.shared_experts.gate_proj.weight": (shared, h), "mlp.shared_experts.up_proj.weight": (shared, h),
        "mlp.shared_experts.down_proj.weight": (h, shared),
    }
