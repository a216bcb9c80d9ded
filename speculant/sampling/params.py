"""User-facing sampling parameters, validated on construction.

Every value is checked against the tensor it becomes (int64 columns, finite float32 columns, a
generator seed), so a request that passes here cannot fail while the engine builds its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from speculant.sampling.structured import StructuredOutput

INT64_MAX = 2**63 - 1
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes any uint64
GREEDY_BELOW = 1e-5  # temperatures below this sample greedily: logits / t would overflow float32


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0  # below GREEDY_BELOW (0 included) means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # return the log-probability of each emitted token
    top_logprobs: int = 0  # with logprobs: also the this many most likely tokens at each position
    num_draft_tokens: int | None = None  # per-request speculation length k (None: engine default)
    structured_output: StructuredOutput | None = None  # the grammar the output must match
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); a dict is accepted
    min_tokens: int = 0  # stop tokens are banned before this many output tokens
    presence_penalty: float = 0.0  # OpenAI: minus this for every token already in the output
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # CTRL / HF: logits of prompt or output tokens divided (> 0) or multiplied (< 0) by it

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple((t, b) for t, b in bias))
        _check(_int_in(self.max_tokens, 1, INT64_MAX), "max_tokens", f"must be an integer in [1, {INT64_MAX}]", self.max_tokens)
        _check(_real(self.temperature) and self.temperature >= 0, "temperature", "must be a finite number >= 0", self.temperature)
        _check(_int_in(self.top_k, 0, INT64_MAX), "top_k", f"must be an integer in [0, {INT64_MAX}]", self.top_k)
        _check(_real(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p)
        _check(_real(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]", self.min_p)
        seed = self.seed
        _check(seed is None or _int_in(seed, 0, SEED_MAX), "seed", f"must be an integer in [0, {SEED_MAX}]", seed)
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings", self.stop)
        ids_ok = all(_int_in(t, 0, INT64_MAX) for t in self.stop_token_ids)
        _check(ids_ok, "stop_token_ids", "must be non-negative integers", self.stop_token_ids)
        _check(_int_in(self.top_logprobs, 0, INT64_MAX), "top_logprobs", "must be an integer >= 0", self.top_logprobs)
        structured = self.structured_output
        _check(structured is None or isinstance(structured, StructuredOutput), "structured_output", "must be a StructuredOutput", structured)
        bias_ok = all(_int_in(t, 0, INT64_MAX) and _real(b) and -100 <= b <= 100 for t, b in self.logit_bias)
        _check(bias_ok, "logit_bias", "must map token ids to numbers in [-100, 100]", self.logit_bias)
        min_ok = _int_in(self.min_tokens, 0, INT64_MAX) and self.min_tokens <= self.max_tokens
        _check(min_ok, "min_tokens", "must be an integer in [0, max_tokens]", self.min_tokens)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_real(value) and -2 <= value <= 2, name, "must be a number in [-2, 2]", value)
        rep = self.repetition_penalty
        _check(_real(rep) and 0 < rep <= 100, "repetition_penalty", "must be a number in (0, 100]", rep)
        k = self.num_draft_tokens
        _check(k is None or _int_in(k, 0, INT64_MAX), "num_draft_tokens", "must be an integer >= 0", k)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def adjusts_logits(self) -> bool:
        """Whether the target's logits are changed before sampling (grammar, bias, bans, penalties)."""
        penalised = self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        return bool(self.structured_output or self.logit_bias or self.min_tokens or penalised)


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")


__all__ = ["GREEDY_BELOW", "INT64_MAX", "SamplingParams", "StructuredOutput"]
