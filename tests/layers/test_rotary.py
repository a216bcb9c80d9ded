"""YaRN RoPE as DeepSeek-V3 configures it: frequencies and the cos/sin amplitude against
transformers' implementation."""

from __future__ import annotations

import pytest
import torch
from testkit import arch_of, tiny_deepseek_config

from speculant.layers.rotary import inverse_frequencies, rotary_amplitude


@pytest.mark.parametrize("mscale", [(1.0, 1.0), (1.0, 0.707), (None, None), (0.8, 1.2)])
def test_yarn_matches_transformers(mscale):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": mscale[0], "mscale_all_dim": mscale[1]}  # fmt: skip
    config = tiny_deepseek_config(rope_parameters={k: v for k, v in rope.items() if v is not None})
    hf_inv_freq, hf_amplitude = ROPE_INIT_FUNCTIONS["yarn"](config)
    arch = arch_of(type("M", (), {"config": config})())
    ours = inverse_frequencies(arch.head_dim, arch.rope_theta, arch.rope_scaling)
    torch.testing.assert_close(ours, hf_inv_freq, rtol=1e-6, atol=0)
    assert rotary_amplitude(arch.rope_scaling) == pytest.approx(hf_amplitude)
