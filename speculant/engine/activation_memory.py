"""Bytes one forward may allocate beyond weights and K/V, per model family: a decoder layer's
live activations at T tokens, and the attention backend's workspace for the largest step. The
memory plan (`speculant.engine.memory`) takes the largest over its models; the notation is its.
"""

from __future__ import annotations

import torch

from speculant.config import ArchConfig, EngineConfig
from speculant.executor.model_runner import ModelRunner

FP32 = 4


def activation_bytes(runner: ModelRunner, tokens: int, exposed_layers: int = 0) -> int:
    """One decoder layer's live activations at `tokens` tokens (layers run one after another):
    the residual and the normed input, then either the gate/up product twice while `linear`
    makes it contiguous ([T, 2I] x 2), or the fused qkv twice and four rotary temporaries of the
    q and k heads; plus the forward's returned hidden states. A model exposing `exposed_layers`
    feature layers (an eagle3 head reads them, `Executor.expose_features`) also holds each one's
    output and their concatenation ([T, hidden] x 2 a layer). On a CPU a half-precision weight is
    widened to fp32 for many-row products: the largest (the lm_head or the fused gate/up) and
    the fp32 input and output rows."""
    a, elt = runner.arch, runner.dtype.itemsize
    mlp = 4 * a.intermediate_size
    attn = 2 * (a.q_size + 2 * a.kv_size) + 4 * (a.q_size + a.kv_size)
    per_token = (3 + 2 * exposed_layers) * a.hidden_size + max(mlp, attn, deepseek_per_token(a))
    upcast = 0
    if runner.device.type == "cpu" and runner.dtype != torch.float32:
        widest = max(a.vocab_size, 2 * a.intermediate_size)
        upcast = FP32 * (widest * a.hidden_size + tokens * (a.hidden_size + 2 * widest))
    return tokens * per_token * elt + upcast


def deepseek_per_token(a: ArchConfig) -> int:
    """DeepSeek-V3's per-token layer temporaries (elements), 0 for other families. MLA: the fused
    down-projection, q [H(dn + r)] and its rotated part, the absorbed query [H(R + r)] with its
    latent half, the attention output [H R] and after W_UV [H dv]. MoE: k routed copies of the
    row, their gate/up [2 I_e] twice and outputs, the shared experts' gate/up."""
    if a.mla is None or a.moe is None:
        return 0
    m, e, h = a.mla, a.moe, a.num_heads
    mla = (m.q_lora_rank or h * m.qk_head_dim) + m.kv_lora_rank + 2 * m.qk_rope_head_dim
    mla += h * (m.qk_head_dim + 2 * m.qk_rope_head_dim + 3 * m.kv_lora_rank + m.qk_rope_head_dim + m.v_head_dim)
    moe = e.experts_per_token * (3 * a.hidden_size + 4 * e.expert_intermediate_size)
    moe += 4 * e.num_shared_experts * e.expert_intermediate_size
    return max(mla, moe)


def largest_step_attention(runner: ModelRunner, config: EngineConfig, k: int) -> int:
    """The backend's workspace at B sequences padded to the most queries one step gives a
    sequence (a prefill chunk beside B - 1 decodes, or k + 1 verified tokens) over L keys; for
    MLA's expanded path (long chunks), the gathered latents [B, L, R + r] expanded into per-head
    keys [B, L, H, dn] and [B, L, H, dn + r] and values [B, L, H, dv]."""
    sched, max_pos = config.scheduler, runner.arch.max_position
    max_q = max(k + 1, min(sched.max_num_batched_tokens - sched.max_num_seqs + 1, max_pos))
    workspace = runner.backend.workspace_bytes(sched.max_num_seqs, max_q, max_pos)
    m = runner.arch.mla
    if m is not None and max_q >= getattr(runner.model, "expand_min_queries", max_q + 1):
        per_key = m.kv_lora_rank + m.qk_rope_head_dim + runner.arch.num_heads * (2 * m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        workspace += sched.max_num_seqs * max_pos * per_key * runner.dtype.itemsize
    return workspace
