"""The Llama-shaped families whose layers differ from Llama's by switches in `ArchConfig`:
Qwen3 (per-head q/k RMSNorm before RoPE) and Gemma 3 text (q/k norms, GeGLU, norms on the
attention and MLP outputs and before the MLP, RMSNorm weights offset by one, scaled input
embeddings, attention scaled by `query_pre_attn_scalar`, sliding-window layers with their own
RoPE base, optional final logit soft-capping). One layer function reads the switches; Llama's
own `decoder_layer` is left as it is, so a Llama-family model runs no extra work per layer.
Phi-3 needs none of this: its fused products are split on load and it runs as Llama.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.config import ArchConfig, RopeScaling
from speculant.layers.norm import add_rms_norm, rms_norm
from speculant.layers.rotary import RotaryEmbedding, rotate_heads
from speculant.models.base import ForwardContext
from speculant.models.llama import Attend, LayerWeights, LlamaForCausalLM


@dataclass
class VariantLayerWeights(LayerWeights):
    qk_norm: torch.Tensor | None = None  # [heads + kv_heads, head_dim]: q_norm per q head, k_norm per k head
    attn_out_norm: torch.Tensor | None = None  # [hidden] on the attention output (Gemma's post_attention_layernorm)
    mlp_out_norm: torch.Tensor | None = None  # [hidden] on the MLP output (Gemma's post_feedforward_layernorm)


class LlamaVariantForCausalLM(LlamaForCausalLM):
    def __init__(self, arch: ArchConfig, device: torch.device, dtype: torch.dtype, weights: str = "fp32") -> None:
        super().__init__(arch, device, dtype, weights)
        if arch.query_pre_attn_scalar is not None:
            self.scale = arch.query_pre_attn_scalar**-0.5
        self.sliding = frozenset(arch.sliding_layers)
        if self.sliding:  # the backends whose plans take a window
            self.attention_backends = ("torch", "native")
        self.local_rotary = self.rotary
        if self.sliding and arch.local_rope_theta is not None:
            local = dataclasses.replace(arch, rope_theta=arch.local_rope_theta, rope_scaling=RopeScaling())
            self.local_rotary = RotaryEmbedding(local, device, dtype)
        self.embed_scale = torch.tensor(arch.embed_scale, dtype=dtype, device=device)

    def load_weights(self, weights: dict) -> None:
        super().load_weights(weights)
        self.norm = self.norm + self.arch.norm_weight_offset

    def _load_layer(self, get, weights: dict, i: int) -> VariantLayerWeights:
        a, p = self.arch, f"model.layers.{i}."
        base = super()._load_layer(get, weights, i)
        w = VariantLayerWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        offset = a.norm_weight_offset
        norm = lambda name: get(p + name) + offset  # noqa: E731
        w.input_norm = base.input_norm + offset
        w.post_norm = base.post_norm + offset
        if a.qk_norm:
            q, k = norm("self_attn.q_norm.weight"), norm("self_attn.k_norm.weight")
            w.qk_norm = torch.cat([q.expand(a.num_heads, -1), k.expand(a.num_kv_heads, -1)])
        if a.sandwich_norms:  # Gemma's post_attention_layernorm normalises the attention output
            w.attn_out_norm, w.post_norm = w.post_norm, norm("pre_feedforward_layernorm.weight")
            w.mlp_out_norm = norm("post_feedforward_layernorm.weight")
        return w

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens)
        return x * self.embed_scale if self.arch.embed_scale != 1.0 else x

    def forward(self, input_ids, positions, ctx: ForwardContext, input_embeds=None, hidden_states=None) -> torch.Tensor:
        if hidden_states is not None:
            raise ValueError("hidden_states: a decoder takes no hidden-state input (draft heads do)")
        x = self.embed(input_ids) if input_embeds is None else input_embeds  # [T, hidden]
        return self._segments(x, positions, ctx, [len(self.layers)])[0]

    def _segments(self, x: torch.Tensor, positions, ctx: ForwardContext, ends: list[int]) -> list[torch.Tensor]:
        """[T, hidden] the residual stream after each of `ends` layers (sorted; the last: all)."""
        full = self.rotary.lookup(positions)
        local = self.local_rotary.lookup(positions) if self.local_rotary is not self.rotary else full
        out = []
        for i, layer in enumerate(self.layers):
            sliding = i in self.sliding
            meta = ctx.window_meta if sliding and ctx.window_meta is not None else ctx.meta
            cos, sin = local if sliding else full

            def attend(q, k, v, i=i, meta=meta):
                return ctx.backend.forward(q, k, v, ctx.k_cache[i], ctx.v_cache[i], meta, self.scale)

            x = variant_layer(self.arch, layer, x, cos, sin, attend)
            if i + 1 in ends:
                out.append(x)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        logits = super().compute_logits(hidden)
        cap = self.arch.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def variant_layer(a: ArchConfig, w: VariantLayerWeights, x: torch.Tensor, cos, sin, attend: Attend) -> torch.Tensor:
    """`speculant.models.llama.decoder_layer` with the variant switches of `a` (x [T, hidden])."""
    eps, head_dim, heads = a.rms_norm_eps, a.head_dim, a.num_heads + a.num_kv_heads
    h = rms_norm(x, w.input_norm, eps)
    qkv = w.qkv(h)  # [T, q_size + 2 * kv_size]
    num_tokens = qkv.shape[0]
    if w.qk_norm is not None:  # each head normalised on its own, before RoPE
        qk = qkv[:, : a.q_size + a.kv_size].view(num_tokens, heads, head_dim)
        qk = (F.rms_norm(qk, (head_dim,), eps=eps) * w.qk_norm).view(num_tokens, heads * head_dim)
    else:
        qk = qkv
    qk = rotate_heads(qk, heads, head_dim, cos, sin)  # [T, heads + kv_heads, D]
    q, k = qk[:, : a.num_heads], qk[:, a.num_heads :]
    v = qkv[:, a.q_size + a.kv_size :].view(num_tokens, a.num_kv_heads, head_dim)
    out = w.o(attend(q, k, v))
    if w.attn_out_norm is not None:
        x = x + rms_norm(out, w.attn_out_norm, eps)
        h = rms_norm(x, w.post_norm, eps)
    else:
        x, h = add_rms_norm(x, out, w.post_norm, eps)
    gate, up = w.gate_up(h).chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if a.hidden_act == "gelu_tanh" else F.silu(gate)
    out = w.down(act * up)
    return x + (out if w.mlp_out_norm is None else rms_norm(out, w.mlp_out_norm, eps))
