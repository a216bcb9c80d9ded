"""Fixtures of the training tests: a byte-level tokenizer with a chat template, a tiny model
folder the CLI can load by path, a tiny checkpoint in memory, its trainer-side tensors and
precomputed shards over a few toy conversations."""

from __future__ import annotations

import pytest
import torch
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.config import ModelConfig
from speculant.training.hidden import HiddenOptions, Sequence, precompute
from speculant.training.target import target_tensors

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


@pytest.fixture(scope="module")
def hidden_dir(tmp_path_factory, checkpoint):
    """Shards over a few toy conversations (prompt of 4 tokens, periodic responses)."""
    g = torch.Generator().manual_seed(0)
    sequences = []
    for n in range(7):
        prompt = torch.randint(3, 260, (4,), generator=g).tolist()
        sequences.append(Sequence(prompt + [10 + (n + i) % 7 for i in range(12 + 3 * n)], prompt_len=4))
    folder = tmp_path_factory.mktemp("hidden")
    options = HiddenOptions(top_k=8, max_seq_len=64, forward_tokens=64, shard_tokens=60, page_size=4)
    precompute(checkpoint, ModelConfig(model="tiny"), sequences, folder, options, progress=False)
    return folder


@pytest.fixture(scope="module")
def target(checkpoint):
    return target_tensors(checkpoint, "tiny")
