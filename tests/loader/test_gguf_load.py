"""GGUF files written from tiny HF models load back to the same weights, arch and tokenizer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gguf import GGMLQuantizationType as QType
from safetensors.torch import load_file
from transformers import AutoTokenizer

from speculant import LLM
from speculant.loader import CheckpointError, load_checkpoint
from speculant.loader.fused import split_fused
from speculant.sampling.params import SamplingParams

QTYPES = [QType.F32, QType.F16, QType.Q8_0, QType.Q4_1, QType.Q5_0, QType.Q4_K, QType.Q6_K]


FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_weights_match_reference_dequantization(request, gguf_writer, family, qtype):
    hf_dir = request.getfixturevalue(f"tiny_{family}_dir")
    path, expected = gguf_writer(hf_dir, qtype)
    ckpt = load_checkpoint(str(path))
    assert ckpt.weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert ckpt.weights[name].dtype == torch.float32
        assert torch.equal(ckpt.weights[name], tensor), name


@pytest.mark.parametrize("qtype", [QType.Q2_K, QType.Q3_K, QType.IQ2_XS, QType.IQ3_S, QType.IQ4_XS, QType.TQ2_0], ids=lambda q: q.name)
def test_types_without_a_kernel_load_dequantized(tiny_llama_dir, gguf_writer, qtype):
    """gguf.quants' other block types load as its dequantization, dense even when quantized
    weights are kept (no kernel runs them); the model generates from them."""
    path, expected = gguf_writer(tiny_llama_dir, qtype)
    ckpt = load_checkpoint(str(path), keep_quantized=True)
    for name, tensor in expected.items():
        assert isinstance(ckpt.weights[name], torch.Tensor) and torch.equal(ckpt.weights[name], tensor), name
    out = LLM(model=str(path), page_size=4, num_pages=32).generate([1, 40, 41], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_gguf_equals_safetensors_exactly(request, gguf_writer, family):
    # The writer permutes llama q/k like llama.cpp; an exact round trip proves the unpermute.
    hf_dir = request.getfixturevalue(f"tiny_{family}_dir")
    path, _ = gguf_writer(hf_dir, QType.F32)
    ckpt = load_checkpoint(str(path))
    original = split_fused(load_file(hf_dir / "model.safetensors"), load_checkpoint(str(hf_dir)).arch)
    assert ckpt.weights.keys() == original.keys()
    for name, tensor in original.items():
        if family == "gemma3" and name.endswith("norm.weight"):  # stored as 1 + w, read back minus 1
            torch.testing.assert_close(ckpt.weights[name], tensor, atol=2**-24, rtol=0, msg=name)
        else:
            assert torch.equal(ckpt.weights[name], tensor), name


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_f32_gguf_generates_as_the_folder(request, gguf_writer, family):
    hf_dir = request.getfixturevalue(f"tiny_{family}_dir")
    path, _ = gguf_writer(hf_dir, QType.F32)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = [1, 40, 41, 42, 60, 61, 70]  # past Gemma's 4-token window
    outs = [LLM(model=str(m), page_size=4, num_pages=32).generate(prompt, params)[0].token_ids for m in (hf_dir, path)]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_arch_matches_hf_config(request, gguf_writer, family):
    hf_dir = request.getfixturevalue(f"tiny_{family}_dir")
    path, _ = gguf_writer(hf_dir, QType.Q8_0)
    from_gguf = load_checkpoint(str(path)).arch
    from_hf = load_checkpoint(str(hf_dir)).arch
    # GGUF stores eps as float32; compare the rest exactly.
    assert from_gguf.rms_norm_eps == pytest.approx(from_hf.rms_norm_eps)
    # The file's EOS (2), then <|endoftext|> (0), which llama.cpp also ends generation on.
    assert from_gguf.eos_token_ids == (2, 0) and from_hf.eos_token_ids == (2,)
    same = dict(rms_norm_eps=from_hf.rms_norm_eps, eos_token_ids=from_hf.eos_token_ids)
    assert dataclasses.replace(from_gguf, **same) == from_hf
    assert from_gguf.family == family
    assert from_gguf.attention_bias == (family == "qwen2")
    assert from_gguf.tie_word_embeddings == (family == "qwen2")


def test_bfloat16_requested(tiny_qwen2_dir, gguf_writer):
    path, expected = gguf_writer(tiny_qwen2_dir, QType.Q8_0)
    ckpt = load_checkpoint(str(path), dtype=torch.bfloat16)
    for name, tensor in expected.items():
        assert ckpt.weights[name].dtype == torch.bfloat16
        assert torch.equal(ckpt.weights[name], tensor.to(torch.bfloat16)), name


TEXTS = [
    "hello world",
    "  the  world\n\n\tin 12 345",
    "héllo wörld 日本語 🙂",
    "def f(x):\n    return x ** 2  # sq",
    "<|im_start|>user\nthe world<|im_end|>\n",
    "",
]


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "qwen2", "llama-bpe"])
@pytest.mark.parametrize("add_bos", [False, True])
def test_tokenizer_matches_transformers_gguf_tokenizer(tiny_llama_dir, gguf_writer, pre, add_bos):
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, tokenizer_pre=pre, add_bos=add_bos)
    ours = load_checkpoint(str(path)).tokenizer
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ours.decode(ids) == theirs.decode(ids)
        if pre == "smollm" and any(c.isdigit() for c in text):
            continue  # transformers does not know "smollm"; see test_smollm_splits_digits
        assert ids == theirs(text)["input_ids"], text
    assert (ours("x")["input_ids"][0] == ours.bos_token_id) == add_bos
    assert (ours.bos_token, ours.eos_token, ours.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
    )


def test_chat_template_renders(tiny_qwen2_dir, gguf_writer):
    path, _ = gguf_writer(tiny_qwen2_dir, QType.F16)
    tokenizer = load_checkpoint(str(path)).tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"


def test_smollm_splits_digits(tiny_llama_dir, gguf_writer):
    # llama.cpp and SmolLM2's tokenizer.json split every digit apart (the tiny vocab has a "12"
    # merge that the GPT-2 split would use); transformers' GGUF tokenizer does not.
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, tokenizer_pre="smollm")
    tokenizer = load_checkpoint(str(path)).tokenizer
    assert tokenizer.convert_ids_to_tokens(tokenizer("a 12")["input_ids"]) == ["a", "Ġ", "1", "2"]


@pytest.mark.parametrize("pre", ["falcon3", "tekken"])
def test_unknown_pre_tokenizer_is_an_error_naming_it(tiny_llama_dir, gguf_writer, pre):
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, tokenizer_pre=pre)
    with pytest.raises(CheckpointError, match=rf"tokenizer.ggml.pre = '{pre}'"):
        load_checkpoint(str(path))
