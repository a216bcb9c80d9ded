"""logit_bias, min_tokens and the repetition, frequency and presence penalties are exact under
speculation: each verified position is penalised by the output before it, drafts on its path
included, so greedy speculative output equals greedy plain output token for token (every method,
a batch of eight with mixed rules); each rule does what it says; and none adds a host read."""

from __future__ import annotations

import pytest
from constrained_models import METHODS, PROMPTS, build_models, make_llm

from speculant import SamplingParams
from speculant.utils import sync

EOS = 2
RULES = [
    dict(repetition_penalty=3.0),
    dict(frequency_penalty=2.0),
    dict(presence_penalty=2.0),
    dict(logit_bias={1000: 6.0, 2000: 4.0}),
    dict(min_tokens=10, logit_bias={EOS: 40.0}),  # EOS would come at once but for min_tokens
    dict(repetition_penalty=0.8, frequency_penalty=-0.5),  # rewards repeats: n-gram drafts hit
    dict(presence_penalty=-1.0, logit_bias={EOS: -100.0}),
    dict(),
]


@pytest.fixture(scope="module")
def models(smol_tokenizer):
    return build_models(smol_tokenizer)


def _params(rules: dict) -> SamplingParams:
    return SamplingParams(max_tokens=40, temperature=0.0, logprobs=True, **rules)


def _seen(out) -> tuple:
    return out.token_ids, out.logprobs, out.finish_reason


@pytest.fixture(scope="module")
def plain(models):
    return make_llm(models).generate(PROMPTS, [_params(r) for r in RULES])


def test_each_rule_does_what_it_says(models, plain):
    free = make_llm(models).generate(PROMPTS, [_params({})] * len(PROMPTS))
    assert [o.token_ids for o in plain] != [o.token_ids for o in free]
    biased = plain[3].token_ids
    assert biased.count(1000) + biased.count(2000) > len(biased) // 2, biased
    assert len(plain[4].token_ids) == 11 and plain[4].token_ids[-1] == EOS  # EOS the first moment it may come
    assert EOS not in plain[6].token_ids
    for rules, out in zip(RULES[:3], plain[:3]):  # penalised repeats: fewer repeated tokens than without
        assert len(set(out.token_ids)) >= len(set(free[RULES.index(rules)].token_ids)), rules


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_speculation_with_logit_rules_equals_plain(models, plain, method):
    llm = make_llm(models, method)
    with sync.strict_sync():
        outs = llm.generate(PROMPTS, [_params(r) for r in RULES])
    assert [_seen(o) for o in outs] == [_seen(o) for o in plain]
    stats = llm.stats()
    assert stats["accepted_tokens"] > 0, stats
    assert stats["host_reads_per_step"] == 1  # counts, bans and biases are built on the device
