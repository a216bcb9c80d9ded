"""Grammars on llguidance: a request's `StructuredOutput` compiled against the model's tokenizer,
one matcher per request, and the token masks of a draft tree's rows.

llguidance (a CPU wheel) is imported when the first constrained request arrives, so engines that
never see one never load it. Its tokenizer view is built once per engine (about a second).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np

from speculant.sampling.structured import StructuredOutput

LLG_LOG_LEVEL = 0  # llguidance prints nothing; errors are read from the matcher


class GrammarCompiler:
    """Compiles structured outputs for one tokenizer and vocabulary."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's logits width
        self.stop_token_ids = sorted(t for t in stop_token_ids if 0 <= t < vocab_size)
        self._lltokenizer = None

    @property
    def num_words(self) -> int:
        """int32 words of one packed mask row (it covers the model's and the tokenizer's ids)."""
        return (self._vocab_width() + 31) // 32

    def _vocab_width(self) -> int:
        return max(self.vocab_size, len(self.tokenizer))

    def lltokenizer(self):
        if self._lltokenizer is None:
            from llguidance.hf import from_tokenizer

            eos = self.stop_token_ids or None  # the ids a finished grammar allows
            self._lltokenizer = from_tokenizer(self.tokenizer, n_vocab=self._vocab_width(), eos_token=eos)
        return self._lltokenizer

    def grammar(self, structured: StructuredOutput) -> str:
        """llguidance's grammar text; a ValueError starting "structured_output" names what is wrong."""
        if self.tokenizer is None:
            raise ValueError("structured_output: this model has no tokenizer to build a grammar over")
        from llguidance import LLMatcher

        kind, spec = structured.kind, structured.spec
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"})
        if kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(spec)
        if kind == "regex":
            return LLMatcher.grammar_from_regex(spec)
        if kind == "choice":
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(spec)))
        return LLMatcher.grammar_from_lark(spec)

    def check(self, structured: StructuredOutput) -> None:
        """Raise ValueError("structured_output: ...") when the grammar does not compile."""
        from llguidance import LLMatcher

        error = LLMatcher.validate_grammar(self.grammar(structured), self.lltokenizer())
        if error:
            raise ValueError(f"structured_output: invalid {structured.kind}: {error.strip()[:500]}")

    def matcher(self, structured: StructuredOutput):
        """A fresh matcher at the grammar's start; ValueError if the grammar fails to compile."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.lltokenizer(), self.grammar(structured), log_level=LLG_LOG_LEVEL)
        if matcher.is_error():
            raise ValueError(f"structured_output: invalid {structured.kind}: {matcher.get_error().strip()[:500]}")
        return matcher


def tree_masks(
    matcher,
    tokens: Sequence[int],  # [n] the tree's draft tokens
    parents: Sequence[int],  # [n] breadth-first parents, -1 under the root
    out: np.ndarray,  # [n + 1, W] int32 C-contiguous, filled with -1 (all allowed)
    ends: frozenset[int] = frozenset(),  # stop tokens: nothing after one is emitted
) -> None:
    """The grammar's mask at each verify row (row 0 the root, row i + 1 node i), each computed in
    the matcher's state after the drafts on that row's path. Rows under a draft the grammar
    refuses, or under a stop token, keep all bits set: acceptance stops at that draft, or the
    request at that token, so they are never used (and llguidance cannot roll an EOS back: one
    taken by a finished grammar is not counted). The matcher is left where it started."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)

    def visit(row: int) -> None:
        matcher.unsafe_compute_mask_ptr(out[row].ctypes.data, out.shape[1] * 4)  # the row in place
        for child in children[row]:
            token = tokens[child]
            if token not in ends and allows(out[row], token) and matcher.consume_token(token):
                visit(child + 1)
                matcher.rollback(1)

    visit(0)


def allows(mask: np.ndarray, token: int) -> bool:  # mask [W] int32 packed
    return 0 <= token < 32 * mask.shape[0] and bool((int(mask[token // 32]) >> (token % 32)) & 1)


def consume(matcher, tokens: Sequence[int]) -> bool:
    """Advance over `tokens` one at a time: llguidance's `consume_tokens` refuses an EOS once the
    grammar has stopped, `consume_token` takes it."""
    return all(matcher.consume_token(t) for t in tokens)


__all__ = ["GrammarCompiler", "allows", "consume", "tree_masks"]
