"""DeepSeek-V3 folders: sharded safetensors with the MTP module in its own shard, and FP8
block-scaled weights dequantized on load with their `weight_scale_inv`."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from testkit import tiny_hf_model, with_mtp_layer

from speculant import LLM, SamplingParams
from speculant.loader import load_checkpoint

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], list(range(30, 52))]
BLOCK = 16  # FP8 scale blocks of 16 x 16 so that tiny matrices hold several


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    vocab = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    return tiny_hf_model("deepseek", seed=2, vocab_size=vocab, num_mtp_layers=1)


def _save(folder, hf, tiny_llama_dir):
    """Sharded checkpoint, tokenizer, and the MTP module in a shard of its own (as DeepSeek ships)."""
    hf.save_pretrained(folder, max_shard_size="200KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_dir / name, folder / name)
    n = hf.config.num_hidden_layers
    mtp = {k: v.contiguous() for k, v in with_mtp_layer(hf).weights.items() if k.startswith(f"model.layers.{n}.")}
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    mtp = _per_expert(mtp, hf.config.n_routed_experts)
    save_file(mtp, str(folder / "mtp.safetensors"))
    index["weight_map"] |= {k: "mtp.safetensors" for k in mtp}
    index_path.write_text(json.dumps(index))
    return folder


def _per_expert(weights: dict, num_experts: int) -> dict:
    """transformers' fused expert tensors split one expert at a time, as checkpoint files keep them."""
    out = {}
    for name, t in weights.items():
        if name.endswith("experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            for e in range(num_experts):
                gate, up = t[e].chunk(2)
                out[f"{p}{e}.gate_proj.weight"], out[f"{p}{e}.up_proj.weight"] = gate.contiguous(), up.contiguous()
        elif name.endswith("experts.down_proj"):
            p = name[: -len("down_proj")]
            out |= {f"{p}{e}.down_proj.weight": t[e].contiguous() for e in range(num_experts)}
        else:
            out[name] = t
    return out


def _hf_greedy(hf, prompt):
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(GREEDY.max_tokens):
            tokens.append(int(hf(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def test_sharded_folder_generates_like_transformers(tmp_path, hf, tiny_llama_dir):
    folder = _save(tmp_path / "ds", hf, tiny_llama_dir)
    assert len(list(folder.glob("*.safetensors"))) > 2
    ckpt = load_checkpoint(str(folder))
    assert ckpt.arch.family == "deepseek_v3" and ckpt.arch.mtp_layers == 1
    assert "model.layers.3.eh_proj.weight" in ckpt.weights and "model.layers.3.shared_head.head.weight" not in ckpt.weights
    llm = LLM(model=str(folder), page_size=4, num_pages=64)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == [_hf_greedy(hf, p) for p in PROMPTS]


def test_fp8_block_scaled_weights_are_dequantized(tmp_path, hf, tiny_llama_dir):
    folder = _save(tmp_path / "fp8", hf, tiny_llama_dir)
    expected = {}
    for shard in folder.glob("*.safetensors"):
        tensors = load_file(shard)
        for name in [n for n, t in tensors.items() if n.endswith("_proj.weight") and t.dim() == 2]:
            weight, scale = _quantize_fp8(tensors[name])
            tensors[name], tensors[name[: -len("weight")] + "weight_scale_inv"] = weight, scale
            expected[name] = _dequantize(weight, scale)
        save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] |= {n[: -len("weight")] + "weight_scale_inv": index["weight_map"][n] for n in expected}
    index_path.write_text(json.dumps(index))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]}
    (folder / "config.json").write_text(json.dumps(config))

    ckpt = load_checkpoint(str(folder))
    assert not any(n.endswith("_scale_inv") for n in ckpt.weights)
    for name, weight in expected.items():
        assert torch.equal(ckpt.weights[name], weight), name
    # The dequantized model generates as transformers does on the same dequantized weights.
    state = {k: v for k, v in hf.state_dict().items()}
    for name, weight in expected.items():
        if name in state:
            state[name] = weight
    reference = tiny_hf_model("deepseek", seed=2, vocab_size=hf.config.vocab_size, num_mtp_layers=1)
    reference.load_state_dict(_fused(state, expected, hf.config))
    llm = LLM(model=str(folder), page_size=4, num_pages=64)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == [_hf_greedy(reference, p) for p in PROMPTS]


def _fused(state: dict, expected: dict, config) -> dict:
    """transformers' fused expert tensors rebuilt from the dequantized per-expert weights."""
    for i in range(config.first_k_dense_replace, config.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        experts = range(config.n_routed_experts)
        state[p + "gate_up_proj"] = torch.stack([torch.cat([expected[f"{p}{e}.gate_proj.weight"], expected[f"{p}{e}.up_proj.weight"]]) for e in experts])
        state[p + "down_proj"] = torch.stack([expected[f"{p}{e}.down_proj.weight"] for e in experts])
    return state


def _quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = -(-w.shape[0] // BLOCK), -(-w.shape[1] // BLOCK)
    scale = torch.empty(rows, cols)
    for r in range(rows):
        for c in range(cols):
            scale[r, c] = w[r * BLOCK : (r + 1) * BLOCK, c * BLOCK : (c + 1) * BLOCK].abs().max() / 448.0
    return (w / _expand(scale, w.shape)).to(torch.float8_e4m3fn), scale


def _expand(scale: torch.Tensor, shape) -> torch.Tensor:
    return scale.repeat_interleave(BLOCK, 0)[: shape[0]].repeat_interleave(BLOCK, 1)[:, : shape[1]]


def _dequantize(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return w.float() * _expand(scale, w.shape)


def test_deepseeks_own_config_keys():
    """config.json as DeepSeek-V3 ships it: no head_dim, legacy `rope_scaling` with `type`,
    `scoring_func`/`topk_method`, an FP8 quantization config; unsupported routing is refused."""
    from speculant.loader.errors import CheckpointError
    from speculant.loader.hf_loader import arch_from_hf_config

    config = {
        "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
        "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
        "scoring_func": "sigmoid", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    }  # fmt: skip
    arch = arch_from_hf_config(config)
    assert (arch.head_dim, arch.mla.qk_head_dim, arch.mla.q_lora_rank, arch.mla.rope_interleave) == (64, 192, 1536, True)
    assert (arch.moe.num_groups, arch.moe.topk_groups, arch.moe.first_dense_layers, arch.mtp_layers) == (8, 4, 3, 1)
    s = arch.rope_scaling
    assert (s.kind, s.factor, s.original_max_position, s.mscale_all_dim) == ("yarn", 40.0, 4096, 1.0)
    with pytest.raises(CheckpointError, match="sigmoid scoring"):
        arch_from_hf_config({**config, "scoring_func": "softmax"})
    with pytest.raises(CheckpointError, match="kv_lora_rank"):
        arch_from_hf_config({k: v for k, v in config.items() if k != "kv_lora_rank"})
