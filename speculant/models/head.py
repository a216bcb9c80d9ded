"""The draft head (MTP / EAGLE): one decoder layer on the target's own hidden states.

Head entry i (RoPE position i, KV slot i of the sequence) reads the target's last-layer state h_i
(before the final norm) and the embedding of the next token t_{i+1}; its output predicts t_{i+2}.
For a second draft the head reads its own output in place of h_{i+1}. Three variants:

- ``normed`` (DeepSeek-V3's MTP module): RMSNorm on the embedding (enorm) and on the hidden state
  (hnorm), concat, projection (eh_proj), the decoder layer, an RMSNorm before the lm_head;
- ``eagle`` (the original EAGLE head): concat of the raw embedding and hidden state, projection, the
  decoder layer, the lm_head; no norms of its own;
- ``eagle3`` (EAGLE-3): ``normed`` reading, in place of h_i, three target layers' outputs fused
  (`speculant.models.head_features`: fused by width, so its own outputs go in unfused), and
  scoring with an lm_head of its own (``lm_head.weight``, trained).

The embedding and lm_head are the target's tensors, never copied (eagle3: the embedding). With a
reduced draft vocabulary (`vocab_map`, sorted target ids) the head scores only those rows of the
lm_head (eagle3's own has just those rows) and puts -inf elsewhere: its q is zero outside the map,
which the lossless acceptance rule handles. The math below (`build_modules`, `head_forward`,
`head_logits`) is what inference (`speculant.models.draft_head.DraftHead`) and training both run;
training passes trainable tensors and a causal-mask `attend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.config import ArchConfig
from speculant.layers.norm import rms_norm
from speculant.models.deepseek_v3 import (
    expanded_attend,
    load_mla_layer,
    mla_decoder_layer,
    mtp_layer_shapes,
)
from speculant.models.head_features import (
    FEATURE_VARIANT,
    FeatureFusion,
    build_fusion,
    feature_weight_shapes,
    fuse_if_features,
)
from speculant.models.llama import Attend, LayerWeights, decoder_layer

HEAD_VARIANTS = ("normed", "eagle", FEATURE_VARIANT)
NORMED = ("normed", FEATURE_VARIANT)  # the variants with enorm, hnorm and a final norm
Product = Callable[[torch.Tensor], torch.Tensor]
MakeLinear = Callable[[torch.Tensor, torch.Tensor | None], Product]
Block = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Attend], torch.Tensor]  # x, cos, sin, attend -> x


def head_arch(target: ArchConfig) -> ArchConfig:
    """The head's shape: the target's decoder layer, one of it."""
    return dataclasses.replace(target, num_layers=1)


def head_weight_shapes(arch: ArchConfig, variant: str, with_layer: bool = True, draft_vocab: int = 0) -> dict[str, tuple[int, ...]]:
    """Every trainable tensor of a head, by name (DeepSeek MTP names; the layer's Hugging Face names,
    Llama's or, for a DeepSeek-V3 target, its MTP block's; `with_layer=False`: the head's own tensors alone, for a block of the target's family;
    `draft_vocab`: the rows of an eagle3 head's lm_head, 0 for the whole vocabulary)."""
    if variant not in HEAD_VARIANTS:
        raise ValueError(f"head variant must be one of {list(HEAD_VARIANTS)}, got {variant!r}")
    h = arch.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"eh_proj.weight": (h, 2 * h)}
    if variant in NORMED:
        shapes.update({"enorm.weight": (h,), "hnorm.weight": (h,), "norm.weight": (h,)})
    if variant == FEATURE_VARIANT:
        shapes.update(feature_weight_shapes(arch, draft_vocab))
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


def init_head_weights(
    arch: ArchConfig, variant: str, seed: int = 0, std: float = 0.02, draft_vocab: int = 0, lm_head: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Fresh fp32 weights: norms 1, biases 0, matrices (and stacked experts) N(0, std); an eagle3
    head's lm_head [draft_vocab or vocab, hidden] a copy of `lm_head` (the target's rows) if given."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    rows = draft_vocab if lm_head is None else lm_head.shape[0]
    for name, shape in head_weight_shapes(arch, variant, draft_vocab=rows).items():
        if name == "lm_head.weight" and lm_head is not None:
            out[name] = lm_head.detach().float().clone()
        elif len(shape) >= 2:
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
    enorm: torch.Tensor | None  # [hidden] (normed variants)
    hnorm: torch.Tensor | None
    norm: torch.Tensor | None
    fuse: FeatureFusion | None = None  # eagle3: the target's feature layers [T, 3 * hidden] -> [T, hidden]
    lm_head: Product | None = None  # eagle3: its own lm_head, [hidden] -> [Nk] (or [vocab])


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
    normed, fused = variant in NORMED, variant == FEATURE_VARIANT
    block = _block(weights, arch, linear) if with_layer else None
    return HeadModules(
        variant, linear(weights["eh_proj.weight"], None), block,
        weights["enorm.weight"] if normed else None,
        weights["hnorm.weight"] if normed else None,
        weights["norm.weight"] if normed else None,
        build_fusion(weights, arch, linear) if fused else None,
        linear(weights["lm_head.weight"], None) if fused else None,
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
    hidden: torch.Tensor,  # [T, hidden] h_i: the target's states (or the head's own outputs); eagle3: [T, 3 * hidden] features
    cos: torch.Tensor,  # [T, 1, head_dim] rotary tables at the entries' positions
    sin: torch.Tensor,
    attend: Attend,
) -> torch.Tensor:  # [T, hidden] the head's output states (before its final norm)
    return m.block(head_input(arch, m, embeds, hidden), cos, sin, attend)


def head_input(arch: ArchConfig, m: HeadModules, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """[T, hidden] the block's input: eh_proj over the (normed) embedding and hidden state (an
    eagle3 head's [T, 3 * hidden] target features fused to [T, hidden] first)."""
    eps = arch.rms_norm_eps
    hidden = fuse_if_features(m.fuse, hidden)
    if m.enorm is not None:
        embeds = rms_norm(embeds, m.enorm, eps)
        hidden = rms_norm(hidden, m.hnorm, eps)
    return m.eh_proj(torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1))


def head_logits(
    arch: ArchConfig,
    m: HeadModules,
    out: torch.Tensor,  # [N, hidden] head output states
    lm_head: torch.Tensor | None,  # [V, hidden] the target's lm_head weight (unused by eagle3: its own)
    vocab_map: torch.Tensor | None = None,  # [Nk] int64 target ids the head scores; None: all
) -> torch.Tensor:  # [N, Nk] (or [N, V]) in the states' dtype
    if m.norm is not None:
        out = rms_norm(out, m.norm, arch.rms_norm_eps)
    if m.lm_head is not None:  # eagle3: its own rows, already the draft vocabulary's
        return m.lm_head(out)
    rows = lm_head if vocab_map is None else lm_head.index_select(0, vocab_map)
    return F.linear(out, rows)
