"""Grammar masks of a draft tree's rows: each row's mask is the matcher's after the drafts on
its path; rows under a refused draft allow everything; the matcher ends where it started."""

from __future__ import annotations

import numpy as np
import pytest

from speculant.engine.grammar import GrammarCompiler, allows, tree_masks
from speculant.sampling.structured import StructuredOutput


@pytest.fixture(scope="module")
def compiler():
    from speculant.loader import load_checkpoint

    tokenizer = load_checkpoint("smollm2-135m").tokenizer
    return GrammarCompiler(tokenizer, len(tokenizer), {tokenizer.eos_token_id})


def _ids(compiler, text: str) -> list[int]:
    return compiler.tokenizer.encode(text, add_special_tokens=False)


def test_tree_rows_are_masked_by_the_state_after_their_path(compiler):
    matcher = compiler.matcher(StructuredOutput("regex", "ab(c|d)"))
    a, b, c, d, x = (_ids(compiler, ch)[0] for ch in "abcdx")
    eos = compiler.tokenizer.eos_token_id
    tokens, parents = [a, x, b, c, d, eos], [-1, -1, 0, 2, 2, 3]  # a -> b -> {c -> eos, d}; x refused
    out = np.full((len(tokens) + 1, compiler.num_words), -1, dtype=np.int32)
    tree_masks(matcher, tokens, parents, out, frozenset({eos}))
    assert allows(out[0], a) and not allows(out[0], b) and not allows(out[0], x)
    assert (out[2] == -1).all()  # under the refused x
    assert allows(out[1], b) and not allows(out[1], a)
    assert allows(out[3], c) and allows(out[3], d) and not allows(out[3], b)
    assert allows(out[4], eos) and not allows(out[4], c)  # after a, b, c: only the end
    assert allows(out[5], eos)
    assert (out[6] == -1).all()  # under the stop token
    probe = np.full((1, compiler.num_words), -1, dtype=np.int32)
    tree_masks(matcher, [], [], probe)
    assert np.array_equal(probe[0], out[0])  # back at the start


def test_a_bad_grammar_is_a_value_error_naming_the_field(compiler):
    for structured in (StructuredOutput("regex", "a(b"), StructuredOutput("grammar", "start: nothing_here"), StructuredOutput.json_schema({"type": "nonsense"})):
        with pytest.raises(ValueError, match="^structured_output: invalid"):
            compiler.check(structured)
