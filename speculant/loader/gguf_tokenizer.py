"""A Hugging Face fast tokenizer rebuilt from a GGUF file's `tokenizer.*` metadata.

Byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: SmolLM2, Qwen2, Llama 3) are built
here directly with `tokenizers`; their pre-tokenizer split follows `tokenizer.ggml.pre`, as in
llama.cpp's llama-vocab.cpp and the models' own tokenizer.json; a `pre` whose split is not
implemented here is a `CheckpointError` naming it (`SUPPORTED_PRES`). Sentencepiece vocabularies
("llama") go through transformers' own GGUF conversion, which handles their many variants.

BOS: `tokenizer.ggml.add_bos_token` is honoured as written, which is what transformers' GGUF
tokenizer does (its `add_bos_token` comes from that key). The SmolLM2 and Qwen2.5 files in the
registry say false, matching their Hugging Face tokenizers, which add no BOS.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from speculant.loader.errors import CheckpointError
from speculant.loader.gguf_file import GGUFFile

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types that are matched whole in text

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_REGEX_SPLITS = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
}
# Splits applied one after the other (llama.cpp's DEEPSEEK3_LLM, DeepSeek-V3's tokenizer.json):
# digits in runs of up to three, CJK runs, then a GPT-4-like split of the rest.
_SPLIT_SEQUENCES = {
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
# Vocabularies split like GPT-2 but with every digit on its own ("smollm" in llama.cpp;
# `Digits(individual_digits=True)` before `ByteLevel` in SmolLM2's tokenizer.json).
_DIGIT_SPLIT_PRES = frozenset({"smollm", "starcoder", "refact", "codeshell"})
# "default" is what a file that names no pre-tokenizer reads as; it, "gpt-2" (llama.cpp's name for
# GPT-2's split, as its converter writes it) and "gpt2" split as GPT-2.
SUPPORTED_PRES = frozenset({"gpt2", "gpt-2", "default", *_REGEX_SPLITS, *_SPLIT_SEQUENCES, *_DIGIT_SPLIT_PRES})


def gguf_tokenizer(gguf: GGUFFile) -> PreTrainedTokenizerFast:
    meta = gguf.metadata
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        return _transformers_gguf_tokenizer(gguf.path)
    if kind != "gpt2":
        raise CheckpointError(
            gguf.path, f"unsupported tokenizer model {kind!r} (want 'gpt2' or 'llama')"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    token_types = list(meta.get("tokenizer.ggml.token_type", ()))
    backend = _byte_level_bpe(tokens, meta.get("tokenizer.ggml.merges", []))
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in SUPPORTED_PRES:
        raise CheckpointError(
            gguf.path, f"unsupported pre-tokenizer tokenizer.ggml.pre = {pre!r}: its split is not implemented (supported: {sorted(SUPPORTED_PRES)})"
        )
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    _add_whole_tokens(backend, tokens, token_types)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **_special_tokens(meta, tokens))
    tokenizer.chat_template = meta.get("tokenizer.chat_template")
    return tokenizer


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the spelling of byte-level vocabularies."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in mapping]
    return mapping | {b: chr(256 + i) for i, b in enumerate(others)}


@functools.cache
def _alphabet_chars() -> frozenset[str]:
    return frozenset(byte_alphabet().values())


def _spelled(token: str) -> bool:
    return set(token) <= _alphabet_chars()


def _byte_level_bpe(tokens: list[str], merges: list[str]) -> Tokenizer:
    alphabet = byte_alphabet()
    # A token written in plain text (a mislabelled special token) is respelled in the byte alphabet
    # so the vocabulary stays consistent, as transformers' converter does.
    vocab = {
        token if _spelled(token) else "".join(alphabet[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    return Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    splits = _SPLIT_SEQUENCES.get(pre) or ((_REGEX_SPLITS[pre],) if pre in _REGEX_SPLITS else ())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not splits)
    if splits:
        isolated = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        return pre_tokenizers.Sequence([*isolated, byte_level])
    if pre in _DIGIT_SPLIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level  # "gpt2", "gpt-2" and "default": GPT-2's own split


def _add_whole_tokens(backend: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    """Control tokens (like <|im_start|>) become special tokens, user-defined ones plain added
    tokens; both are then matched whole in text instead of being cut into byte pieces."""
    special = [
        t for t, kind in zip(tokens, token_types, strict=False) if kind == _CONTROL and _spelled(t)
    ]
    user = [t for t, kind in zip(tokens, token_types, strict=False) if kind == _USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _special_tokens(meta: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            kwargs[f"{role}_token"] = tokens[int(token_id)]
    return kwargs


def _transformers_gguf_tokenizer(path: pathlib.Path) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
