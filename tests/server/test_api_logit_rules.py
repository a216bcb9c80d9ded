"""logit_bias, min_tokens and the penalties through the server: honoured, and the same tokens,
usage and logprobs on speculative servers as on the plain one."""

from __future__ import annotations

import httpx
from server_helpers import MODEL

BODY = {"model": MODEL, "prompt": "Fruit list: apple, banana, apple,", "max_tokens": 24, "temperature": 0, "logprobs": 1, "ignore_eos": True}
RULES = [
    {"presence_penalty": 1.5, "frequency_penalty": 0.5},
    {"repetition_penalty": 2.0},
    {"logit_bias": {"28": 8.0, "30": 5.0}},
    {"min_tokens": 8, "ignore_eos": False, "logit_bias": {"2": 30.0}},  # EOS (2) held back for 8 tokens
]


def _post(running, body: dict) -> dict:
    return httpx.post(f"{running.url}/v1/completions", json=body, timeout=60).json()


def test_rules_are_honoured_and_exact_under_speculation(server, ngram_server, draft_server):
    free = _post(server, BODY)["choices"][0]
    for rules in RULES:
        body = {**BODY, **rules}
        plain = _post(server, body)
        assert plain["choices"][0]["text"] != free["text"], rules
        for running in (ngram_server, draft_server):
            out = _post(running, body)
            assert out["choices"][0]["text"] == plain["choices"][0]["text"], rules
            assert out["choices"][0]["logprobs"]["token_logprobs"] == plain["choices"][0]["logprobs"]["token_logprobs"], rules
            assert out["usage"] == plain["usage"], rules
    biased = _post(server, {**BODY, **RULES[2]})["choices"][0]["logprobs"]["tokens"]
    assert sum(t in (",", ".") for t in biased) > len(biased) // 2, biased  # ids 28 and 30
    held = _post(server, {**BODY, **RULES[3]})
    assert held["usage"]["completion_tokens"] == 9 and held["choices"][0]["finish_reason"] == "stop"
