"""config.json of Qwen3, Gemma 3 and Phi-3: the variant fields, older spellings, and what the
model does not implement refused by name."""

from __future__ import annotations

import pathlib

import pytest
from testkit import tiny_hf_config

from speculant.config import RopeScaling
from speculant.loader import CheckpointError
from speculant.loader.hf_loader import arch_from_hf_config


def _config(kind: str, **changes) -> dict:
    return tiny_hf_config(kind).to_dict() | changes


def test_gemma3_fields():
    arch = arch_from_hf_config(_config("gemma3"))
    assert (arch.family, arch.qk_norm, arch.hidden_act, arch.sandwich_norms, arch.norm_weight_offset) == ("gemma3", True, "gelu_tanh", True, 1.0)
    assert arch.embed_scale == 64**0.5 and arch.query_pre_attn_scalar == 24 and arch.final_logit_softcap == 5.0
    assert (arch.sliding_window, arch.sliding_layers, arch.rope_theta, arch.local_rope_theta) == (6, (0, 2), 1e6, 1e4)


def test_gemma3_older_spelling():
    """rope_theta / rope_local_base_freq / rope_scaling side by side, layer types by pattern."""
    config = _config("gemma3", num_hidden_layers=7, layer_types=None, sliding_window_pattern=6, rope_parameters=None,
                     rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})  # fmt: skip
    arch = arch_from_hf_config(config)
    assert arch.sliding_layers == (0, 1, 2, 3, 4, 6)
    assert (arch.rope_theta, arch.local_rope_theta, arch.rope_scaling) == (1e6, 1e4, RopeScaling("linear", 8.0))


@pytest.mark.parametrize(
    "kind, field, value",
    [("gemma3", "attn_logit_softcapping", 50.0), ("gemma3", "hidden_activation", "relu"),
     ("gemma3", "use_bidirectional_attention", True), ("gemma3", "layer_types", ["full_attention"]),
     ("phi3", "partial_rotary_factor", 0.75)],
)  # fmt: skip
def test_what_the_model_lacks_is_refused_by_name(kind, field, value):
    with pytest.raises(CheckpointError, match=f"config.json.*{field}"):
        arch_from_hf_config(_config(kind, **{field: value}), pathlib.Path("folder"))


def test_qwen3_and_phi3():
    assert arch_from_hf_config(_config("qwen3")).qk_norm
    phi3 = arch_from_hf_config(_config("phi3"))
    assert phi3.family == "phi3" and phi3.is_llama_layer
