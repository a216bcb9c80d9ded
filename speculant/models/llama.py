"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5) in our own code.

Per layer: fused QKV projection (with bias for Qwen2), RoPE applied to q and k heads together,
paged attention through the backend, fused gate/up projection. Weights arrive under Hugging Face
names and are fused on load; each product is a `speculant.layers.linear` layer chosen then (dense
with a measured kernel, int8 or int4), so the forward below never looks at dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.config import ArchConfig
from speculant.layers.linear import Linear, make_linear
from speculant.layers.norm import add_rms_norm, rms_norm
from speculant.layers.quant import cat_rows
from speculant.layers.rotary import RotaryEmbedding, rotate_heads
from speculant.models import native_stack
from speculant.models.base import CausalLM, ForwardContext

# attention over flat tokens: q [T, heads, head_dim], k/v [T, kv_heads, head_dim] -> [T, heads * head_dim]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [hidden] -> [q_size + 2 * kv_size] (with bias for Qwen2)
    o: Linear  # [q_size] -> [hidden]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [hidden] -> [2 * intermediate]
    down: Linear  # [intermediate] -> [hidden]


class LlamaForCausalLM(CausalLM):
    exposes_layers = True
    def __init__(self, arch: ArchConfig, device: torch.device, dtype: torch.dtype, weights: str = "fp32") -> None:
        self.arch, self.device, self.dtype, self.weights_mode = arch, device, dtype, weights
        self.rotary = RotaryEmbedding(arch, device, dtype)
        self.scale = arch.head_dim**-0.5
        self.layers: list[LayerWeights] = []
        self.embed_tokens = self.norm = torch.empty(0)
        self.lm_head: Linear | None = None
        self._stack = False  # the native stack: False until built, None where it cannot run

    def load_weights(self, weights: dict) -> None:
        """HF-named weights: float tensors, or quantized layouts (`speculant.layers.quant`) for
        Linear weights a quantized checkpoint keeps quantized."""
        get = lambda name: _take(weights, name).to(self.device, self.dtype)  # noqa: E731
        self.embed_tokens = get("model.embed_tokens.weight")
        self.norm = get("model.norm.weight")
        # A tied head has its own quantized copy when the loader kept the embedding quantized.
        head = weights.get("lm_head.weight")
        if head is None or (self.arch.tie_word_embeddings and isinstance(head, torch.Tensor)):
            head = self.embed_tokens
        self.lm_head = self._linear(head)
        self.layers = [self._load_layer(get, weights, i) for i in range(self.arch.num_layers)]
        self._stack = False  # not built yet

    def _linear(self, weight, bias: torch.Tensor | None = None, keep_weight: bool = True) -> Linear:
        """keep_weight=False for a decoder layer's own products (the lm_head's weight may be the
        embedding, or read by a draft head)."""
        mode = self.weights_mode
        if self.device.type != "cpu":  # the int4/int8 kernels used here are CPU kernels
            weight = weight if isinstance(weight, torch.Tensor) else weight.dequantize()
            mode = "bf16" if mode == "bf16" else "fp32"
        if isinstance(weight, torch.Tensor):
            weight = weight.to(self.device)
        return make_linear(weight, bias, mode, self.dtype, keep_weight)

    def _load_layer(self, get, weights: dict, i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        attn = [f"{p}self_attn.{x}_proj" for x in "qkv"]
        bias = None
        if self.arch.attention_bias:
            bias = torch.cat([get(f"{name}.bias") for name in attn])
        mlp = [f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"]
        return LayerWeights(
            input_norm=get(f"{p}input_layernorm.weight"),
            qkv=self._linear(cat_rows([_take(weights, f"{name}.weight") for name in attn]), bias, keep_weight=False),
            o=self._linear(_take(weights, f"{p}self_attn.o_proj.weight"), keep_weight=False),
            post_norm=get(f"{p}post_attention_layernorm.weight"),
            gate_up=self._linear(cat_rows([_take(weights, name) for name in mlp]), keep_weight=False),
            down=self._linear(_take(weights, f"{p}mlp.down_proj.weight"), keep_weight=False),
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
        if native_stack.runs(ctx, x) and self._native_stack() is not None:
            return native_stack.forward(self._stack, x, cos, sin, ctx)
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, cos, sin, ctx)
        return x

    def forward_features(self, input_ids, positions, ctx: ForwardContext, layers: tuple[int, ...], input_embeds=None):
        """(last [T, hidden], [T, len(layers) * hidden]): one pass over the layers that keeps the
        stream after each feature layer, with the bits of one `forward` (`CausalLM.forward_features`)."""
        x = self.embed(input_ids) if input_embeds is None else input_embeds  # [T, hidden]
        ends = sorted({i + 1 for i in layers} | {len(self.layers)})
        after = dict(zip(ends, self._segments(x, positions, ctx, ends)))  # layers run -> [T, hidden]
        return after[len(self.layers)], torch.cat([after[i + 1] for i in layers], dim=-1)

    def _segments(self, x: torch.Tensor, positions, ctx: ForwardContext, ends: list[int]) -> list[torch.Tensor]:
        """[T, hidden] the residual stream after each of `ends` layers (sorted; the last: all)."""
        cos, sin = self.rotary.lookup(positions)
        if native_stack.runs(ctx, x) and self._native_stack() is not None:  # one call, the states at `ends` kept
            return native_stack.forward_taps(self._stack, x, cos, sin, ctx, ends)
        out, start = [], 0
        for end in ends:
            for i in range(start, end):
                x = self._layer(i, self.layers[i], x, cos, sin, ctx)
            out.append(x)
            start = end
        return out

    def _native_stack(self):
        """The layers as one native call (`native_stack`), built at the first forward after a load."""
        if self._stack is False:
            self._stack = native_stack.build(self)
        return self._stack

    def _layer(self, i: int, w: LayerWeights, x: torch.Tensor, cos, sin, ctx: ForwardContext) -> torch.Tensor:
        def attend(q, k, v):
            return ctx.backend.forward(q, k, v, ctx.k_cache[i], ctx.v_cache[i], ctx.meta, self.scale)

        return decoder_layer(self.arch, w, x, cos, sin, attend)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden]
        return rms_norm(hidden, self.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.lm_head(self.final_norm(hidden)).float()


def decoder_layer(a: ArchConfig, w: LayerWeights, x: torch.Tensor, cos, sin, attend: Attend) -> torch.Tensor:
    """One pre-norm decoder layer over flat tokens x [T, hidden]; `attend` runs attention (paged
    through a backend at inference, a causal mask in head training). Any callables will do as
    `w`'s products (plain `F.linear` on trainable tensors for training)."""
    h = rms_norm(x, w.input_norm, a.rms_norm_eps)
    qkv = w.qkv(h)  # [T, q_size + 2 * kv_size]
    num_tokens = qkv.shape[0]
    qk = rotate_heads(qkv, a.num_heads + a.num_kv_heads, a.head_dim, cos, sin)  # [T, heads + kv_heads, D]
    q, k = qk[:, : a.num_heads], qk[:, a.num_heads :]
    v = qkv[:, a.q_size + a.kv_size :].view(num_tokens, a.num_kv_heads, a.head_dim)
    x, h = add_rms_norm(x, w.o(attend(q, k, v)), w.post_norm, a.rms_norm_eps)
    gate, up = w.gate_up(h).chunk(2, dim=-1)
    return x + w.down(F.silu(gate) * up)


def _take(weights: dict, name: str):
    if name not in weights:
        raise KeyError(f"checkpoint lacks tensor {name!r}")
    return weights[name]
