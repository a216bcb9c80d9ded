"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5) in our own code.

Per layer: fused QKV projection (with bias for Qwen2), RoPE applied to q and k heads together,
paged attention through the backend, fused gate/up projection. Weights arrive under Hugging Face
names and are fused on load.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.config import ArchConfig
from speculant.layers.linear import linear
from speculant.layers.rotary import RotaryEmbedding, apply_rotary
from speculant.models.base import CausalLM, ForwardContext


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [q_size + 2 * kv_size, hidden]
    qkv_bias: torch.Tensor | None  # [q_size + 2 * kv_size]
    o: torch.Tensor  # [hidden, q_size]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


class LlamaForCausalLM(CausalLM):
    def __init__(self, arch: ArchConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.arch, self.device, self.dtype = arch, device, dtype
        self.rotary = RotaryEmbedding(arch, device, dtype)
        self.scale = arch.head_dim**-0.5
        self.layers: list[LayerWeights] = []
        self.embed_tokens = self.norm = self.lm_head = torch.empty(0)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        get = lambda name: _take(weights, name).to(self.device, self.dtype)  # noqa: E731
        self.embed_tokens = get("model.embed_tokens.weight")
        self.norm = get("model.norm.weight")
        tied = self.arch.tie_word_embeddings or "lm_head.weight" not in weights
        self.lm_head = self.embed_tokens if tied else get("lm_head.weight")
        self.layers = [self._load_layer(get, weights, i) for i in range(self.arch.num_layers)]

    def _load_layer(self, get, weights: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        attn = [f"{p}self_attn.{x}_proj" for x in "qkv"]
        bias = None
        if self.arch.attention_bias:
            bias = torch.cat([get(f"{name}.bias") for name in attn])
        return LayerWeights(
            input_norm=get(f"{p}input_layernorm.weight"),
            qkv=torch.cat([get(f"{name}.weight") for name in attn]),
            qkv_bias=bias,
            o=get(f"{p}self_attn.o_proj.weight"),
            post_norm=get(f"{p}post_attention_layernorm.weight"),
            gate_up=torch.cat([get(f"{p}mlp.gate_proj.weight"), get(f"{p}mlp.up_proj.weight")]),
            down=get(f"{p}mlp.down_proj.weight"),
        )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor | None,  # [T]
        positions: torch.Tensor,  # [T]
        ctx: ForwardContext,
        input_embeds: torch.Tensor | None = None,  # [T, hidden]
        hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, hidden]
        if hidden_states is not None:
            raise ValueError("hidden_states: a Llama decoder takes no hidden-state input (draft heads do)")
        x = self.embed(input_ids) if input_embeds is None else input_embeds  # [T, hidden]
        cos, sin = self.rotary.lookup(positions)
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, ctx)
        return x

    def _layer(self, i: int, w: LayerWeights, x: torch.Tensor, cos, sin, ctx: ForwardContext) -> torch.Tensor:
        a = self.arch
        h = F.rms_norm(x, (a.hidden_size,), w.input_norm, a.rms_norm_eps)
        qkv = linear(h, w.qkv, w.qkv_bias)  # [T, q_size + 2 * kv_size]
        num_tokens = qkv.shape[0]
        qk = apply_rotary(qkv[:, : a.q_size + a.kv_size].view(num_tokens, -1, a.head_dim), cos, sin)
        q, k = qk[:, : a.num_heads], qk[:, a.num_heads :]
        v = qkv[:, a.q_size + a.kv_size :].view(num_tokens, a.num_kv_heads, a.head_dim)
        attn = ctx.backend.forward(q, k, v, ctx.k_cache[i], ctx.v_cache[i], ctx.meta, self.scale)
        x = x + linear(attn, w.o)
        h = F.rms_norm(x, (a.hidden_size,), w.post_norm, a.rms_norm_eps)
        gate, up = linear(h, w.gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, w.down)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden]
        return F.rms_norm(hidden, (self.arch.hidden_size,), self.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return linear(self.final_norm(hidden), self.lm_head).float()


def _take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in weights:
        raise KeyError(f"checkpoint lacks tensor {name!r}")
    return weights[name]
