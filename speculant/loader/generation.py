"""What a checkpoint says about ending and sampling a generation.

End-of-sequence ids: every id config.json's `eos_token_id` lists (one id or a list), every id
generation_config.json's lists, and in a GGUF file `tokenizer.ggml.eos_token_id`, `eot_token_id`
and `eom_token_id`. A GGUF stores at most one id per key, so llama.cpp, which these files are
written for, also ends generation on any token spelled like an end of turn (its
llama-vocab.cpp list, `GGUF_END_OF_TURN_TEXTS`); we do the same for GGUF files only, so a file
ends where llama.cpp ends it.

Sampling defaults: generation_config.json's temperature, top_p, top_k and min_p, applied to a
request that leaves them unset (as vLLM does; `do_sample` is not read, as in vLLM).
"""

from __future__ import annotations

import pathlib
from typing import Any

from speculant.config import GenerationDefaults
from speculant.loader.errors import CheckpointError
from speculant.sampling.params import SamplingParams

GENERATION_CONFIG = "generation_config.json"
GGUF_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
GGUF_END_OF_TURN_TEXTS = frozenset(
    {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>"}
)
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def eos_ids(value: Any, path: pathlib.Path, field: str = "eos_token_id") -> tuple[int, ...]:
    """`eos_token_id` as written (an int, a list of ints, or absent) -> the ids, in order."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CheckpointError(path, f"{field} must be a non-negative integer or a list of them, got {value!r}")
    return tuple(values)


def hf_generation_config(folder: pathlib.Path) -> tuple[tuple[int, ...], GenerationDefaults]:
    """(EOS ids, sampling defaults) of a folder's generation_config.json; none when it has none."""
    from speculant.loader.files import read_json

    path = folder / GENERATION_CONFIG
    if not path.exists():
        return (), GenerationDefaults()
    config = read_json(path)
    defaults = GenerationDefaults(**{k: config[k] for k in _SAMPLING_KEYS if config.get(k) is not None})
    try:
        SamplingParams(**defaults.sampling_overrides())
    except ValueError as exc:
        raise CheckpointError(path, f"unusable sampling default: {exc}") from None
    return eos_ids(config.get("eos_token_id"), path), defaults


def gguf_eos_ids(meta: dict[str, Any], path: pathlib.Path) -> tuple[int, ...]:
    """The ids a GGUF file's metadata names as ending generation (see the module docstring)."""
    tokens = list(meta.get("tokenizer.ggml.tokens", ()))
    named = {key: int(meta[key]) for key in GGUF_EOS_KEYS if meta.get(key) is not None}
    for key, token_id in named.items():
        if tokens and not 0 <= token_id < len(tokens):
            raise CheckpointError(path, f"{key} {token_id} is outside the vocabulary of {len(tokens)} tokens")
    by_text = [i for i, t in enumerate(tokens) if t in GGUF_END_OF_TURN_TEXTS]
    return tuple(dict.fromkeys([*named.values(), *by_text]))
