"""Fixtures shared by the speculation tests: a tiny target, its plain greedy outputs for the
test module's own `PROMPTS` and `GREEDY`, and a draft head fitted on half of them."""

from __future__ import annotations

import pytest
from testkit import fit_head, tiny_hf_model, tiny_llm


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def plain_outputs(request, target):
    module = request.module
    return [o.token_ids for o in tiny_llm(target).generate(module.PROMPTS, module.GREEDY)]


@pytest.fixture(scope="module")
def head(request, target, plain_outputs):
    """A head fitted on the target's own greedy continuations of half the module's prompts."""
    prompts = request.module.PROMPTS
    sequences = [p + o for p, o in zip(prompts[::2], plain_outputs[::2])]
    return fit_head(target, sequences, steps=150)
