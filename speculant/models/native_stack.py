"""The decoder stack as one native call (`kernels/csrc/stack.cpp`): where every product of every
layer runs on the native CPU kernels, activations are float32, attention is the native backend
and the layers are plain Llama layers, a forward's 30-odd layers take one call from Python instead
of about 20 dispatches each. The kernels, operands and order are those of `llama.decoder_layer`,
so the output has the same bits either way (tests/models/test_native_stack.py)."""

from __future__ import annotations

import torch

from speculant.kernels import native
from speculant.models.base import ForwardContext

PRODUCTS = ("qkv", "o", "gate_up", "down")


def build(model):
    """The native stack of a Llama-family model's layers, or None where some piece cannot run natively."""
    kernels, arch = native.module(), model.arch
    if kernels is None or model.device.type != "cpu" or model.dtype != torch.float32 or not arch.is_llama_layer:
        return None
    layers = []
    for w in model.layers:
        operands = [_operands(getattr(w, name)) for name in PRODUCTS]
        norms = (w.input_norm, w.post_norm)
        if any(op is None for op in operands) or any(n.dtype != torch.float32 for n in norms):
            return None
        products = [kernels.product(kind, ops, bias, out) for kind, ops, bias, out in operands]
        layers.append(kernels.layer(w.input_norm.contiguous(), w.post_norm.contiguous(), *products))
    return kernels.stack(layers, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.rms_norm_eps, model.scale)


def _operands(product) -> tuple | None:
    """A `layers.linear` product's native operands; None for any other (a tensor-parallel shard)."""
    native_operands = getattr(product, "native_operands", None)
    return None if native_operands is None else native_operands()


def runs(ctx: ForwardContext, x: torch.Tensor) -> bool:
    """Whether this forward may take the stack: the native backend's plan, no sliding-window plan,
    float32 activations that need no gradient."""
    if ctx.backend.name != "native" or ctx.window_meta is not None or x.dtype != torch.float32 or x.dim() != 2:
        return False
    return not (torch.is_grad_enabled() and x.requires_grad)


def forward(stack, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
    """x [T, hidden], cos/sin [T, 1, head_dim] as `RotaryEmbedding.lookup` gives them -> [T, hidden]."""
    return stack.forward(*_inputs(x, cos, sin, ctx), native.simd())


def forward_taps(stack, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext, ends: list[int]) -> list[torch.Tensor]:
    """The same forward in the same one call, with the residual stream [T, hidden] after each of
    `ends` layers (sorted layer counts, the last of them all the layers)."""
    return stack.forward_taps(*_inputs(x, cos, sin, ctx), native.simd(), ends)


def _inputs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext) -> tuple:
    m, tokens, head_dim = ctx.meta, x.shape[0], cos.shape[-1]
    return (
        x.contiguous(), cos.reshape(tokens, head_dim), sin.reshape(tokens, head_dim), ctx.k_cache, ctx.v_cache,
        m.slots, m.tok_seq, m.tok_keys, m.mask, m.slot_mapping,
    )
