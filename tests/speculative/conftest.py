"""Fixtures shared by the speculation tests: a tiny target, and its plain greedy outputs for the
test module's own `PROMPTS` and `GREEDY`."""

from __future__ import annotations

import pytest
from testkit import tiny_hf_model, tiny_llm


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def plain_outputs(request, target):
    module = request.module
    return [o.token_ids for o in tiny_llm(target).generate(module.PROMPTS, module.GREEDY)]
