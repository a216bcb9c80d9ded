"""DeepSeek-V3's mixture of experts (DeepSeek-V3 technical report, sec. 2.1.2).

Routing: sigmoid affinities s = sigmoid(x W_r^T); the selection adds the load-balancing bias b
(`e_score_correction_bias`) and is grouped: experts split into `num_groups` groups, a group scores
the sum of its two best biased affinities, the best `topk_groups` groups stay eligible, and the
top `experts_per_token` eligible experts are chosen. Their gates are the unbiased affinities,
normalized to sum 1 (`norm_topk_prob`) and scaled by `routed_scaling_factor`. The shared experts
see every token.

Dispatch: the [T, k] (token, expert) assignments are sorted by expert, so each expert runs one
product over its contiguous run of tokens; the weighted outputs are summed back per token with
one `index_add_`. Run lengths are read on the host once per layer (a counted read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.config import MoeConfig
from speculant.layers.linear import Linear
from speculant.utils.sync import to_list


@dataclass
class MoeWeights:
    router: torch.Tensor  # [E, hidden] float32
    score_bias: torch.Tensor  # [E] float32, added for the selection only
    gate_up: torch.Tensor  # [E, 2 * I, hidden] routed experts' fused gate/up projections
    down: torch.Tensor  # [E, hidden, I]
    shared_gate_up: Linear  # [hidden] -> [2 * I * num_shared]
    shared_down: Linear  # [I * num_shared] -> [hidden]


def route(
    x: torch.Tensor,  # [T, hidden]
    router: torch.Tensor,  # [E, hidden]
    score_bias: torch.Tensor,  # [E]
    cfg: MoeConfig,
) -> tuple[torch.Tensor, torch.Tensor]:  # gates [T, k] float32, experts [T, k] int64
    scores = F.linear(x.float(), router.float()).sigmoid()  # [T, E]
    choice = scores + score_bias
    num_tokens, per_group = scores.shape[0], cfg.num_experts // cfg.num_groups
    grouped = choice.view(num_tokens, cfg.num_groups, per_group)
    group_scores = grouped.topk(min(2, per_group), dim=-1).values.sum(-1)  # [T, G]
    kept = group_scores.topk(cfg.topk_groups, dim=-1).indices  # [T, topk_groups]
    eligible = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
    choice = choice.masked_fill(~eligible.repeat_interleave(per_group, dim=1), float("-inf"))
    experts = choice.topk(cfg.experts_per_token, dim=-1).indices  # [T, k]
    gates = scores.gather(1, experts)
    if cfg.norm_topk_prob:
        gates = gates / (gates.sum(-1, keepdim=True) + 1e-20)
    return gates * cfg.routed_scaling_factor, experts


def routed_experts(
    x: torch.Tensor,  # [T, hidden]
    gates: torch.Tensor,  # [T, k]
    experts: torch.Tensor,  # [T, k]
    gate_up: torch.Tensor,  # [E, 2 * I, hidden]
    down: torch.Tensor,  # [E, hidden, I]
) -> torch.Tensor:  # [T, hidden]
    k = experts.shape[1]
    flat = experts.reshape(-1)  # [T * k]
    order = flat.argsort(stable=True)  # assignments grouped by expert
    tokens = order // k  # [T * k] the token of each sorted assignment
    counts = to_list(torch.bincount(flat, minlength=gate_up.shape[0]))
    rows = x.index_select(0, tokens)  # [T * k, hidden]
    out = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            g, u = F.linear(rows[start : start + n], gate_up[e]).chunk(2, dim=-1)
            out[start : start + n] = F.linear(F.silu(g) * u, down[e])
            start += n
    out = out * gates.reshape(-1)[order, None].to(out.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, out)


def moe_forward(x: torch.Tensor, w: MoeWeights, cfg: MoeConfig) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
    gates, experts = route(x, w.router, w.score_bias, cfg)
    routed = routed_experts(x, gates, experts, w.gate_up, w.down)
    g, u = w.shared_gate_up(x).chunk(2, dim=-1)
    return routed + w.shared_down(F.silu(g) * u)
