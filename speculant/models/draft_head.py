"""The draft head as a model the executor runs (`DraftHead`): the math of `speculant.models.head`
over inference kernels, with its own one-layer K/V in the shared pages, the target's embedding, and
the target's lm_head rows (or, eagle3, its own lm_head) built once into one product."""

from __future__ import annotations

import torch

from speculant.layers.linear import DenseLinear, make_linear
from speculant.layers.norm import rms_norm
from speculant.layers.rotary import RotaryEmbedding
from speculant.models import native_stack
from speculant.models.base import CausalLM, ForwardContext
from speculant.models.head import LlamaBlock, build_modules, head_arch, head_input


class DraftHead(CausalLM):
    """A head as a model the executor runs: its own one-layer K/V in the shared pages, the
    target's embedding and lm_head. `forward` requires `hidden_states`. Its decoder block is the
    target family's own when the family builds one (`CausalLM.head_block`: DeepSeek-V3's MTP
    module is a full MLA + MoE layer), else the Llama layer (`speculant.models.head.LlamaBlock`)."""

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
        self.draft_lm_head = self.modules.lm_head  # eagle3's own, else the map's rows of the target's
        if self.draft_lm_head is None and self.vocab_map is not None:
            self.draft_lm_head = _draft_lm_head(target, self.vocab_map, mode, dtype)
        _check_own_lm_head(params, self.vocab_map, self.arch.vocab_size)

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
        return hidden if m.norm is None else rms_norm(hidden, m.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        if self.draft_lm_head is not None:
            scores = self.draft_lm_head(self.final_norm(hidden)).float()  # [N, Nk] (eagle3 without a map: [N, vocab])
        else:  # the target's lm_head, or where its map's rows cannot be read (untied, quantized) every row, keeping the map's
            scores = self.target.lm_head(self.final_norm(hidden)).float()  # [N, vocab]
            scores = scores if self.vocab_map is None else scores.index_select(1, self.vocab_map)
        if self.vocab_map is None:
            return scores
        logits = scores.new_full((hidden.shape[0], self.arch.vocab_size), float("-inf"))
        return logits.scatter_(1, self.vocab_map.expand(hidden.shape[0], -1), scores)  # ~3x index_copy_'s speed on columns


def _head_mode(target: CausalLM, weights_mode: str) -> str:
    """The head's weight mode: the target's, except that under "auto" a head (float weights)
    over a target whose lm_head is quantized runs int8 products, as cheap next to the target's
    step as the target's own quantized products are."""
    quantized = not isinstance(getattr(target, "lm_head", None), DenseLinear | None)
    return "int8" if weights_mode == "auto" and quantized else weights_mode


def _check_own_lm_head(params: dict[str, torch.Tensor], vocab_map: torch.Tensor | None, vocab_size: int) -> None:
    """An eagle3 head's lm_head has a row per draft token (per token without a map)."""
    own = params.get("lm_head.weight")
    rows = vocab_size if vocab_map is None else vocab_map.numel()
    if own is not None and own.shape[0] != rows:
        raise ValueError(f"lm_head.weight: the head's own lm_head has {own.shape[0]} rows, its draft vocabulary {rows} tokens")


def _draft_lm_head(target: CausalLM, vocab_map: torch.Tensor, weights_mode: str, dtype: torch.dtype):
    """The product over the map's rows of the target's lm_head, built once: a step's head runs
    score Nk rows, not the whole vocabulary (nor gather the rows per call). Int8 where the
    target's lm_head is quantized, else in the head's weight mode; None where the rows cannot be
    read back (an untied quantized lm_head, or a rank's vocabulary shard under tensor parallelism:
    the target's own lm_head then scores and gathers every row)."""
    lm_head = getattr(target, "lm_head", None)
    if isinstance(lm_head, DenseLinear):
        weight = lm_head.weight
    elif target.arch.tie_word_embeddings and isinstance(getattr(target, "embed_tokens", None), torch.Tensor):
        weight = target.embed_tokens
    else:
        return None
    if weight.shape[0] != target.arch.vocab_size:  # a shard of the vocabulary
        return None
    rows = weight.index_select(0, vocab_map).float()  # [Nk, hidden]
    return make_linear(rows, None, weights_mode if isinstance(lm_head, DenseLinear) else "int8", dtype)
