"""Each pre-tokenizer split the GGUF loader implements gives llama.cpp's token ids (the
reference for a GGUF file) on a multilingual sample: accents, CJK, Greek, emoji, code, digits."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QType

from speculant.loader import load_checkpoint
from speculant.loader.gguf_tokenizer import SUPPORTED_PRES

llama_cpp = pytest.importorskip("llama_cpp", reason="needs llama-cpp-python (the llamacpp extra), the reference tokenizer")

SAMPLE = [
    "hello world, the world",
    "  the  world\n\n\tin 12 345 6789",
    "héllo wörld naïve café",
    "日本語のテキスト 中文 한국어",
    "Ελληνικά кириллица עברית العربية",
    "emoji 🙂🚀 and ✓",
    "def f(x):\n    return x ** 2  # it's we're DON'T",
]


@pytest.mark.parametrize("pre", sorted(SUPPORTED_PRES - {"gpt2"}))  # llama.cpp spells it "gpt-2"
def test_pre_tokenizer_matches_llama_cpp(tiny_llama_dir, gguf_writer, pre):
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, tokenizer_pre=pre)
    ours = load_checkpoint(str(path)).tokenizer
    theirs = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in SAMPLE:
        assert ours(text)["input_ids"] == theirs.tokenize(text.encode(), add_bos=False, special=True), (pre, text)
