"""Constrained decoding is exact under speculation: greedy output under a grammar (JSON object,
JSON schema, regex, choice, Lark) is token for token the constrained plain output, with the same
logprobs, under every method, alone and in a batch of eight; drafts the grammar refuses are
rejected, so every output matches its grammar. A step that verifies drafts for a constrained
request reads the host twice (its drafts, for the masks; then its tokens)."""

from __future__ import annotations

import json
import re

import pytest
from constrained_models import CONSTRAINTS, METHODS, PROMPTS, build_models, make_llm

from speculant import SamplingParams
from speculant.utils import sync


@pytest.fixture(scope="module")
def models(smol_tokenizer):
    return build_models(smol_tokenizer)


def _params(constraint, max_tokens: int = 24) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_output=constraint, logprobs=True, top_logprobs=1)


def _seen(out) -> tuple:
    return out.text, out.token_ids, out.logprobs, out.finish_reason


@pytest.fixture(scope="module")
def plain(models):
    llm = make_llm(models)
    return [_seen(o) for o in llm.generate(PROMPTS, [_params(c) for c in CONSTRAINTS])]


def test_constrained_plain_output_matches_its_grammar(plain):
    for (text, _, _, reason), constraint in zip(plain, CONSTRAINTS):
        assert reason in ("stop", "length"), (constraint, reason)
        if reason != "stop":
            continue
        if constraint.kind.startswith("json"):
            json.loads(text)
        elif constraint.kind == "regex":
            assert re.fullmatch(constraint.spec, text), (constraint, text)
        elif constraint.kind == "choice":
            assert text in json.loads(constraint.spec)
    assert any(reason == "stop" for *_, reason in plain), "no grammar ran to its end: the test proves little"


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_constrained_speculation_equals_constrained_plain_batch_8(models, plain, method):
    llm = make_llm(models, method)
    outs = llm.generate(PROMPTS, [_params(c) for c in CONSTRAINTS])
    assert [_seen(o) for o in outs] == plain
    stats = llm.stats()
    assert stats["draft_tokens"] > stats["accepted_tokens"] > 0, stats  # drafts accepted and refused


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_constrained_speculation_equals_constrained_plain_batch_1(models, plain, method):
    llm = make_llm(models, method, max_num_seqs=1)
    for prompt, constraint, expected in zip(PROMPTS, CONSTRAINTS, plain):
        assert _seen(llm.generate([prompt], _params(constraint))[0]) == expected, constraint


@pytest.mark.parametrize("method", list(METHODS))
def test_a_constrained_decode_step_reads_the_host_twice(models, method):
    """The grammar masks need the drafts on the host: one read before the step's one read
    (strict mode: any read outside `utils.sync` raises)."""
    llm = make_llm(models, method)
    with sync.strict_sync():
        llm.generate(PROMPTS, [_params(c) for c in CONSTRAINTS])
    assert 1 < llm.stats()["host_reads_per_step"] <= 2
