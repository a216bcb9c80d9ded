"""DeepSeek-V3 MoE: routing (sigmoid scores, grouped top-k over bias-corrected scores, normalized
and scaled gates) and the sorted dispatch, against transformers' modules on random inputs."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_deepseek_config

from speculant.config import MoeConfig
from speculant.layers.moe import route, routed_experts


def _moe_config(hf_config) -> MoeConfig:
    return MoeConfig(
        num_experts=hf_config.n_routed_experts, experts_per_token=hf_config.num_experts_per_tok,
        expert_intermediate_size=hf_config.moe_intermediate_size, num_shared_experts=hf_config.n_shared_experts,
        num_groups=hf_config.n_group, topk_groups=hf_config.topk_group,
        routed_scaling_factor=hf_config.routed_scaling_factor, norm_topk_prob=hf_config.norm_topk_prob,
    )  # fmt: skip


@pytest.mark.parametrize("groups", [(1, 1), (4, 2), (8, 3)])
def test_routing_matches_transformers(groups):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = tiny_deepseek_config(n_routed_experts=16, n_group=groups[0], topk_group=groups[1], num_experts_per_tok=4)
    torch.manual_seed(0)
    router = DeepseekV3TopkRouter(config)
    with torch.no_grad():
        router.weight.normal_(0, 0.3)
        router.e_score_correction_bias.normal_(0, 0.2)
    x = torch.randn(50, config.hidden_size)
    _, hf_gates, hf_experts = router(x)
    gates, experts = route(x, router.weight, router.e_score_correction_bias, _moe_config(config))
    hf_order, order = hf_experts.argsort(-1), experts.argsort(-1)
    assert torch.equal(hf_experts.gather(1, hf_order), experts.gather(1, order))
    torch.testing.assert_close(hf_gates.gather(1, hf_order), gates.gather(1, order))


def test_bias_changes_the_choice_not_the_gates():
    """The correction bias steers which experts are chosen; the gates stay the unbiased scores."""
    cfg = MoeConfig(num_experts=4, experts_per_token=1, expert_intermediate_size=8, num_shared_experts=0, norm_topk_prob=False)
    router = torch.eye(4, 4)
    x = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    gates, experts = route(x, router, torch.tensor([0.0, 0.5, 0.0, 0.0]), cfg)
    assert experts.tolist() == [[1]]
    torch.testing.assert_close(gates, torch.sigmoid(torch.tensor([[1.0]])))


def test_sorted_dispatch_matches_transformers_experts():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

    config = tiny_deepseek_config()
    torch.manual_seed(1)
    experts = DeepseekV3Experts(config)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.1)
        experts.down_proj.normal_(0, 0.1)
    x = torch.randn(37, config.hidden_size)
    chosen = torch.stack([torch.randperm(config.n_routed_experts)[:3] for _ in range(37)])  # [T, k]
    chosen[:5] = torch.tensor([0, 1, 2])  # some experts busy, others idle
    gates = torch.rand(37, 3)
    with torch.no_grad():
        expected = experts(x, chosen, gates)
    ours = routed_experts(x, gates, chosen, experts.gate_up_proj.detach(), experts.down_proj.detach())
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)
