"""The draft head (MTP / EAGLE): one decoder layer on the target's own hidden states.

Head entry i (RoPE position i, KV slot i of the sequence) reads the target's last-layer state h_i
(before the final norm) and the embedding of the next token t_{i+1}; its output predicts t_{i+2}.
For a second draft the head reads its own output in place of h_{i+1}. Two variants, one flag apart:

- ``normed`` (DeepSeek-V3's MTP module): RMSNorm on the embedding (enorm) and on the hidden state
  (hnorm), concat, projection (eh_proj), the decoder layer, an RMSNorm before the lm_head;
- ``eagle`` (the original EAGLE head): concat of the raw embedding and hidden state, projection, the
  decoder layer, the lm_head; no norms of its own.

The embedding and lm_head are the target's tensors, never copied. With a reduced draft vocabulary
(`vocab_map`, sorted target ids) the head scores only those rows of the target's lm_head, selected
per call, and puts -inf elsewhere: its q is zero outside the map, which the lossless acceptance
rule handles. The math below (`build_modules`, `head_forward`, `head_logits`) is what inference
and training both run; training passes trainable tensors and a causal-mask `attend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.config import ArchConfig
from speculant.layers.linear import DenseLinear, linear, make_linear
from speculant.layers.rotary import RotaryEmbedding
from speculant.models import native_stack
from speculant.models.base import CausalLM, ForwardContext
from speculant.models.deepseek_v3 import (
    expanded_attend,
    load_mla_layer,
    mla_decoder_layer,
    mtp_layer_shapes,
)
from speculant.models.llama import Attend, LayerWeights, decoder_layer

HEAD_VARIANTS = ("normed", "eagle")
Product = Callable[[torch.Tensor], torch.Tensor]
MakeLinear = Callable[[torch.Tensor, torch.Tensor | None], Product]
Block = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Attend], torch.Tensor]  # x, cos, sin, attend -> x


def head_arch(target: ArchConfig) -> ArchConfig:
    """The head's shape: the target's decoder layer, one of it."""
    return dataclasses.replace(target, num_layers=1)


def head_weight_shapes(arch: ArchConfig, variant: str, with_layer: bool = True) -> dict[str, tuple[int, ...]]:
    """Every trainable tensor of a head, by name (DeepSeek MTP names; the layer's Hugging Face names,
    Llama's or, for a DeepSeek-V3 target, its MTP block's; `with_layer=False`: the head's own tensors alone, for a block of the target's family)."""
    if variant not in HEAD_VARIANTS:
        raise ValueError(f"head variant must be one of {list(HEAD_VARIANTS)}, got {variant!r}")
    h = arch.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"eh_proj.weight": (h, 2 * h)}
    if variant == "normed":
        shapes.update({"enorm.weight": (h,), "hnorm.weight": (h,), "norm.weight": (h,)})
    if not with_layer:
        return shapes
    if arch.mla is not None:  # a DeepSeek-V3 target: its MTP module's block (MLA, MoE)
        return shapes | {f"layer.{k}": v for k, v in mtp_layer_shapes(arch).items()}
    return shapes | {f"layer.{k}": v for k, v in _llama_layer_shapes(arch).items()}


def _llama_layer_shapes(a: ArchConfig) -> dict[str, tuple[int, ...]]:
    h = a.hidden_size
    shapes = {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (a.q_size, h),
        "self_attn.k_proj.weight": (a.kv_size, h),
        "self_attn.v_proj.weight": (a.kv_size, h),
        "self_attn.o_proj.weight": (h, a.q_size),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (a.intermediate_size, h),
        "mlp.up_proj.weight": (a.intermediate_size, h),
        "mlp.down_proj.weight": (h, a.intermediate_size),
    }
    if a.attention_bias:
        shapes.update({f"self_attn.{x}_proj.bias": (n,) for x, n in (("q", a.q_size), ("k", a.kv_size), ("v", a.kv_size))})
    return shapes


def init_head_weights(arch: ArchConfig, variant: str, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Fresh fp32 weights: norms 1, biases 0, matrices (and stacked experts) N(0, std)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in head_weight_shapes(arch, variant).items():
        if len(shape) >= 2:
            out[name] = torch.randn(shape, generator=g) * std
        else:
            out[name] = torch.zeros(shape) if name.endswith("bias") else torch.ones(shape)
    return out


@dataclass
class HeadModules:
    """A head's weights ready to run: products are callables (inference kernels or `F.linear`)."""

    variant: str
    eh_proj: Product  # [2 * hidden] -> [hidden]
    block: Block | None  # None: the block is the target family's own, run by the model (`CausalLM.head_block`)
    enorm: torch.Tensor | None  # [hidden] (normed variant)
    hnorm: torch.Tensor | None
    norm: torch.Tensor | None


def dense_product(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Product:
    """`F.linear` on the tensors as they are (autograd flows through; training uses this)."""
    return lambda x: F.linear(x, weight, bias)


def build_modules(
    weights: dict[str, torch.Tensor], arch: ArchConfig, variant: str, linear: MakeLinear = dense_product, with_layer: bool = True
) -> HeadModules:
    """The head's modules from its named weights (q/k/v and gate/up fused as the target's are);
    `with_layer=False` leaves the block to the target's family."""
    missing = sorted(set(head_weight_shapes(arch, variant, with_layer)) - set(weights))
    if missing:
        raise KeyError(f"head weights lack {missing[:4]}")
    normed = variant == "normed"
    block = _block(weights, arch, linear) if with_layer else None
    return HeadModules(
        variant, linear(weights["eh_proj.weight"], None), block,
        weights["enorm.weight"] if normed else None,
        weights["hnorm.weight"] if normed else None,
        weights["norm.weight"] if normed else None,
    )


def _block(weights: dict[str, torch.Tensor], arch: ArchConfig, linear: MakeLinear) -> Block:
    """The head's decoder layer as `(x, cos, sin, attend) -> x`: the Llama layer, or for a DeepSeek-V3
    target its MTP block with attention expanded through `attend` (what head training runs)."""
    if arch.mla is not None:
        get = lambda name, dtype=None: _take(weights, "layer." + name)  # noqa: E731
        mla = load_mla_layer(arch, get, lambda w: linear(w, None))
        return lambda x, cos, sin, attend: mla_decoder_layer(arch, mla, x, cos, sin, expanded_attend(arch, mla, attend))
    return LlamaBlock(arch, _llama_layer(weights, arch, linear))


@dataclass
class LlamaBlock:
    """The Llama decoder layer as a head's block; its weights are there for the native stack."""

    arch: ArchConfig
    layer: LayerWeights

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        return decoder_layer(self.arch, self.layer, x, cos, sin, attend)


def _take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in weights:
        raise KeyError(f"head weights lack {name!r}")
    return weights[name]


def _llama_layer(weights: dict[str, torch.Tensor], arch: ArchConfig, linear: MakeLinear) -> LayerWeights:
    p = "layer."
    attn = [f"{p}self_attn.{x}_proj" for x in "qkv"]
    bias = torch.cat([weights[f"{n}.bias"] for n in attn]) if arch.attention_bias else None
    return LayerWeights(
        input_norm=weights[f"{p}input_layernorm.weight"],
        qkv=linear(torch.cat([weights[f"{n}.weight"] for n in attn]), bias),
        o=linear(weights[f"{p}self_attn.o_proj.weight"], None),
        post_norm=weights[f"{p}post_attention_layernorm.weight"],
        gate_up=linear(torch.cat([weights[f"{p}mlp.gate_proj.weight"], weights[f"{p}mlp.up_proj.weight"]]), None),
        down=linear(weights[f"{p}mlp.down_proj.weight"], None),
    )


def head_forward(
    arch: ArchConfig,
    m: HeadModules,
    embeds: torch.Tensor,  # [T, hidden] embeddings of the next tokens t_{i+1}
    hidden: torch.Tensor,  # [T, hidden] h_i: the target's states (or the head's own outputs)
    cos: torch.Tensor,  # [T, 1, head_dim] rotary tables at the entries' positions
    sin: torch.Tensor,
    attend: Attend,
) -> torch.Tensor:  # [T, hidden] the head's output states (before its final norm)
    return m.block(head_input(arch, m, embeds, hidden), cos, sin, attend)


def head_input(arch: ArchConfig, m: HeadModules, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """[T, hidden] the block's input: eh_proj over the (normed) embedding and hidden state."""
    eps, shape = arch.rms_norm_eps, (arch.hidden_size,)
    if m.enorm is not None:
        embeds = F.rms_norm(embeds, shape, m.enorm, eps)
        hidden = F.rms_norm(hidden, shape, m.hnorm, eps)
    return m.eh_proj(torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1))


def head_logits(
    arch: ArchConfig,
    m: HeadModules,
    out: torch.Tensor,  # [N, hidden] head output states
    lm_head: torch.Tensor,  # [V, hidden] the target's lm_head weight
    vocab_map: torch.Tensor | None = None,  # [Nk] int64 target ids the head scores; None: all
) -> torch.Tensor:  # [N, Nk] (or [N, V]) in the states' dtype
    if m.norm is not None:
        out = F.rms_norm(out, (arch.hidden_size,), m.norm, arch.rms_norm_eps)
    rows = lm_head if vocab_map is None else lm_head.index_select(0, vocab_map)
    return F.linear(out, rows)


class DraftHead(CausalLM):
    """A head as a model the executor runs: its own one-layer K/V in the shared pages, the
    target's embedding and lm_head. `forward` requires `hidden_states`. Its decoder block is the
    target family's own when the family builds one (`CausalLM.head_block`: DeepSeek-V3's MTP
    module is a full MLA + MoE layer), else the Llama layer above."""

    def __init__(self, target: CausalLM, variant: str, weights: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype, weights_mode: str = "fp32") -> None:
        self.arch, self.target, self.variant = head_arch(target.arch), target, variant
        self.scale = self.arch.head_dim**-0.5
        self.rotary = RotaryEmbedding(self.arch, device, dtype)
        vocab_map = weights.get("vocab_map")
        self.vocab_map = None if vocab_map is None else vocab_map.to(device, torch.int64)
        params = {k: v.to(device, dtype) for k, v in weights.items() if k != "vocab_map"}
        self.block = target.head_block(params)  # the target family's own block, or None: a Llama one
        self.attention_backends = target.attention_backends
        mode = _head_mode(target, weights_mode)
        make = lambda w, b: make_linear(w, b, mode, dtype)  # noqa: E731
        self.modules = build_modules(params, self.arch, variant, make, with_layer=self.block is None)
        self.device, self.dtype = device, dtype
        block = self.modules.block
        self.layers = [block.layer] if isinstance(block, LlamaBlock) else []  # what `native_stack` runs
        self._stack = False  # built at the first forward: None where it cannot run
        self.draft_lm_head = None if self.vocab_map is None else _draft_lm_head(target, self.vocab_map, mode, dtype)

    def load_weights(self, weights: dict) -> None:
        raise TypeError("a DraftHead is built from its weights (speculant.models.head_file.load_head)")

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(input_ids)

    def forward(self, input_ids, positions, ctx: ForwardContext, input_embeds=None, hidden_states=None) -> torch.Tensor:
        if hidden_states is None:
            raise ValueError("hidden_states: a draft head reads the target's hidden states")
        embeds = self.embed(input_ids) if input_embeds is None else input_embeds  # [T, hidden]
        if self.block is not None:
            return self.block(head_input(self.arch, self.modules, embeds, hidden_states), positions, ctx)
        cos, sin = self.rotary.lookup(positions)
        x = head_input(self.arch, self.modules, embeds, hidden_states)  # [T, hidden]
        if self.layers and native_stack.runs(ctx, x):
            if self._stack is False:
                self._stack = native_stack.build(self)
            if self._stack is not None:  # the layer in one native call, bits as the layer loop's
                return native_stack.forward(self._stack, x, cos, sin, ctx)

        def attend(q, k, v):
            return ctx.backend.forward(q, k, v, ctx.k_cache[0], ctx.v_cache[0], ctx.meta, self.scale)

        return self.modules.block(x, cos, sin, attend)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        m = self.modules
        return hidden if m.norm is None else F.rms_norm(hidden, (self.arch.hidden_size,), m.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        if self.vocab_map is None:
            return self.target.lm_head(self.final_norm(hidden)).float()
        if self.draft_lm_head is None:  # an untied quantized lm_head: score every row, keep the map's
            scores = self.target.lm_head(self.final_norm(hidden)).float().index_select(1, self.vocab_map)
        else:
            scores = self.draft_lm_head(self.final_norm(hidden)).float()  # [N, Nk]
        logits = scores.new_full((hidden.shape[0], self.arch.vocab_size), float("-inf"))
        return logits.index_copy_(1, self.vocab_map, scores)


def _head_mode(target: CausalLM, weights_mode: str) -> str:
    """The head's weight mode: the target's, except that under "auto" a head (float weights)
    over a target whose lm_head is quantized runs int8 products, as cheap next to the target's
    step as the target's own quantized products are."""
    quantized = not isinstance(getattr(target, "lm_head", None), DenseLinear | None)
    return "int8" if weights_mode == "auto" and quantized else weights_mode


def _draft_lm_head(target: CausalLM, vocab_map: torch.Tensor, weights_mode: str, dtype: torch.dtype):
    """The product over the map's rows of the target's lm_head, built once: a step's head runs
    score Nk rows, not the whole vocabulary (nor gather the rows per call). Int8 where the
    target's lm_head is quantized, else in the head's weight mode; None where the rows cannot be
    read back (an untied quantized lm_head)."""
    lm_head = getattr(target, "lm_head", None)
    if isinstance(lm_head, DenseLinear):
        weight = lm_head.weight
    elif target.arch.tie_word_embeddings and isinstance(getattr(target, "embed_tokens", None), torch.Tensor):
        weight = target.embed_tokens
    else:
        return None
    rows = weight.index_select(0, vocab_map).float()  # [Nk, hidden]
    return make_linear(rows, None, weights_mode if isinstance(lm_head, DenseLinear) else "int8", dtype)
