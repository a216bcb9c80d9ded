"""Fixtures of the training tests: a byte-level tokenizer with a chat template, a tiny model
folder the CLI can load by path, and a tiny checkpoint in memory."""

from __future__ import annotations

import pytest
from testkit import TinyCheckpoint, tiny_hf_model

VOCAB = 260  # <pad>, <s>, </s>, then the 256 bytes
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def byte_tokenizer():
    """A real (fast) tokenizer over bytes, with specials at ids 0-2 like the tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {c: 3 + i for i, c in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def hf_model():
    return tiny_hf_model(vocab_size=VOCAB)


@pytest.fixture(scope="session")
def checkpoint(hf_model, tokenizer):
    return TinyCheckpoint(hf_model, tokenizer)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, hf_model, tokenizer):
    """The tiny model and tokenizer saved as a Hugging Face folder (what `--model PATH` reads)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    hf_model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
