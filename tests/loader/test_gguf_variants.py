"""GGUF files of Qwen3, Gemma 3 and Phi-3: what the model does not implement refused by name, what
llama.cpp assumes for Gemma 3, RoPE scaling keys read as the folder's config."""

from __future__ import annotations

import json
import shutil

import gguf
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


@pytest.mark.parametrize(
    "family, rope, kind",
    [("qwen3", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64}, gguf.RopeScalingType.YARN),
     ("llama", {"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0}, gguf.RopeScalingType.LINEAR)],
)  # fmt: skip
def test_rope_scaling_keys_read_as_the_folder(request, tmp_path, gguf_writer, family, rope, kind):
    folder = tmp_path / "scaled"
    shutil.copytree(request.getfixturevalue(f"tiny_{family}_dir"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"rope_parameters": rope}))

    def scaling(w: gguf.GGUFWriter) -> None:
        w.add_rope_scaling_type(kind)
        w.add_rope_scaling_factor(rope["factor"])
        if "original_max_position_embeddings" in rope:
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])

    path, _ = gguf_writer(folder, QType.F16, extra=scaling)
    assert load_checkpoint(str(path)).arch.rope_scaling == load_checkpoint(str(folder)).arch.rope_scaling
