"""GGUF files of Qwen3, Gemma 3 and Phi-3 with what the model does not implement: refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from speculant.loader import CheckpointError, load_checkpoint


@pytest.mark.parametrize(
    "family, extra, match",
    [
        ("gemma3", lambda w: w.add_attn_logit_softcapping(50.0), "attn_logit_softcapping"),
        ("phi3", lambda w: w.add_rope_dimension_count(48), "phi3.rope.dimension_count"),
        ("phi3", lambda w: w.add_tensor("rope_factors_long.weight", np.ones(32, np.float32)), "rope_factors_long.weight"),
    ],
    ids=["gemma2-style-softcap", "partial-rotary", "longrope"],
)
def test_refused_by_name(request, gguf_writer, family, extra, match):
    path, _ = gguf_writer(request.getfixturevalue(f"tiny_{family}_dir"), QType.F16, extra=extra)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(str(path))


def test_gemma3_fields_llama_cpp_assumes(tiny_gemma3_dir, gguf_writer):
    """Sliding pattern, local RoPE base and attention scalar are not in the file: llama.cpp's."""
    path, _ = gguf_writer(tiny_gemma3_dir, QType.F16)
    arch = load_checkpoint(str(path)).arch
    assert (arch.sliding_layers, arch.local_rope_theta, arch.query_pre_attn_scalar) == ((0, 1), 10000.0, 64.0)
    scaled, _ = gguf_writer(tiny_gemma3_dir, QType.F32, extra=lambda w: w.add_attention_scale(0.25))
    assert load_checkpoint(str(scaled)).arch.query_pre_attn_scalar == 16.0
