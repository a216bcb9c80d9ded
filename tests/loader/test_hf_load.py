"""Hugging Face folders: single-file and sharded safetensors, config variants."""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from speculant.config import RopeScaling
from speculant.loader import load_checkpoint


def test_single_file_folder(tiny_qwen2_dir):
    ckpt = load_checkpoint(str(tiny_qwen2_dir), dtype=torch.bfloat16)
    original = load_file(tiny_qwen2_dir / "model.safetensors")
    assert ckpt.weights.keys() == original.keys()
    assert "lm_head.weight" not in ckpt.weights  # tied
    for name, tensor in original.items():
        assert torch.equal(ckpt.weights[name], tensor.to(torch.bfloat16)), name
    arch = ckpt.arch
    assert (arch.family, arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (
        "qwen2",
        2,
        4,
        2,
        64,
    )
    assert arch.attention_bias and arch.tie_word_embeddings
    assert arch.rope_theta == 1e6 and arch.rope_scaling == RopeScaling()
    assert ckpt.tokenizer.chat_template is not None and ckpt.path == tiny_qwen2_dir


def test_sharded_folder(tmp_path, tiny_llama_dir):
    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_llama_dir).save_pretrained(
        folder, max_shard_size="300KB"
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_dir / name, folder / name)
    assert (folder / "model.safetensors.index.json").exists()
    ckpt = load_checkpoint(str(folder))
    original = load_file(tiny_llama_dir / "model.safetensors")
    assert ckpt.weights.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(ckpt.weights[name], tensor), name


def _with_config(tmp_path, source, **changes):
    folder = tmp_path / "variant"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_llama3_rope_parameters(tmp_path, tiny_llama_dir):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    arch = load_checkpoint(str(_with_config(tmp_path, tiny_llama_dir, rope_parameters=rope))).arch
    assert arch.rope_theta == 500000.0
    assert arch.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)


def test_legacy_rope_keys_and_eos_list(tmp_path, tiny_llama_dir):
    legacy = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}  # fmt: skip
    folder = _with_config(
        tmp_path,
        tiny_llama_dir,
        rope_parameters=None,
        rope_theta=123.0,
        rope_scaling=legacy,
        eos_token_id=[7, 9],
    )
    arch = load_checkpoint(str(folder)).arch
    assert arch.rope_theta == 123.0 and arch.rope_scaling.factor == 8.0 and arch.eos_token_id == 7
