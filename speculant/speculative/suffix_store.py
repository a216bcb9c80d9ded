"""A bounded store of recent finished outputs, looked up by n-gram, scoped per user.

Answers repeat across requests (templated replies, the same code, a re-asked question), so the
n-gram proposer also matches the running sequence's suffix against outputs other requests
produced (the idea of SuffixDecoding). Drafts are only proposals, so output never changes; but
speculation speed is observable, and timing attacks on speculative decoding recover other users'
text that way. Hence every entry belongs to a scope (the user), lookups see their own scope
only, and one shared scope is an explicit opt-in (`ngram_share_store`).

Each entry is an output with the last `max_n` prompt tokens before it (so a match can span the
prompt's end). Memory is bounded by `max_tokens` over all scopes; the oldest entries go first.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreMatch:
    tokens: list[int]  # the continuation (at most the k asked for)
    match_len: int  # n: the suffix length that matched
    count: int  # how many stored n-grams equal the matched one (its frequency)


class SuffixStore:
    def __init__(self, max_tokens: int, min_n: int, max_n: int) -> None:
        self.max_tokens, self.min_n, self.max_n = max_tokens, min_n, max_n
        self._entries: OrderedDict[int, tuple[str, list[int]]] = OrderedDict()  # id -> (scope, tokens), oldest first
        self._latest: dict[tuple, tuple[int, int]] = {}  # (scope, n-gram) -> (entry id, start) of its latest occurrence
        self._count: dict[tuple, int] = {}  # (scope, n-gram) -> occurrences in stored entries
        self._ids = itertools.count()
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, scope: str, tokens: list[int]) -> None:
        """Store one finished sequence (context + output) for lookups of `scope`."""
        tokens = list(tokens)[-self.max_tokens :]
        if len(tokens) <= self.min_n:
            return
        entry = next(self._ids)
        self._entries[entry] = (scope, tokens)
        self.num_tokens += len(tokens)
        for n, start in self._ngrams(tokens):
            key = (scope, tuple(tokens[start : start + n]))
            self._latest[key] = (entry, start)
            self._count[key] = self._count.get(key, 0) + 1
        while self.num_tokens > self.max_tokens:
            self._evict_oldest()

    def _ngrams(self, tokens: list[int]):
        """(n, start) of every n-gram with at least one token after it."""
        for start in range(len(tokens) - 1):
            for n in range(self.min_n, min(self.max_n, len(tokens) - 1 - start) + 1):
                yield n, start

    def _evict_oldest(self) -> None:
        entry, (scope, tokens) = self._entries.popitem(last=False)
        self.num_tokens -= len(tokens)
        for n, start in self._ngrams(tokens):
            key = (scope, tuple(tokens[start : start + n]))
            left = self._count[key] - 1
            if left:
                self._count[key] = left
            else:
                del self._count[key]
            if self._latest.get(key, (None,))[0] == entry:
                del self._latest[key]  # a newer occurrence, if any, stays indexed

    def lookup(self, scope: str, suffix: list[int], k: int) -> StoreMatch | None:
        """The continuation of the longest stored match of `suffix`'s end in `scope`, cut to a
        length that grows with how long and how frequent the match is."""
        if k <= 0:
            return None
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            key = (scope, tuple(suffix[len(suffix) - n :]))
            hit = self._latest.get(key)
            if hit is not None:
                entry, start = hit
                count = self._count[key]
                length = min(k, continuation_length(n, count))
                tokens = self._entries[entry][1][start + n : start + n + length]
                return StoreMatch(tokens, n, count)
        return None


def continuation_length(match_len: int, count: int) -> int:
    """Tokens worth proposing after a match of `match_len` tokens seen `count` times: a short,
    rare match is weak evidence; a long or frequent one predicts further."""
    return max(1, math.ceil(match_len * (1 + math.log2(count))))
