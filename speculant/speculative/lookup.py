"""Prompt lookup: what followed the latest earlier match of a sequence's last n tokens (n from a
longest down to a shortest), for any proposer that copies (`NgramProposer`; an MTP chain's
copies, `head_lookup`). No model, no KV: such drafts are one-hot.

Each request keeps an `NgramIndex` that is fed only the tokens added since it last looked, so a
lookup costs O(new tokens x n-gram sizes), not a rescan of the whole sequence. Finished outputs go
to a bounded cross-request `SuffixStore`, scoped per user (`Request.user`; requests without one
use none), and a request copies from whichever matches a longer suffix: its own tokens or its
user's stored outputs (`ContextLookup`).
"""

from __future__ import annotations

import numpy as np

from speculant.config import NgramConfig
from speculant.core import Request, RequestStatus
from speculant.speculative.suffix_store import SuffixStore

SHARED_SCOPE = "*"  # every user's outputs in one scope (ngram_share_store)
_COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


class NgramIndex:
    """The latest start of every n-gram (min_n <= n <= max_n) of a growing token sequence.

    Only n-grams that end before the sequence's last token are indexed, so a lookup of the
    sequence's own suffix finds an earlier occurrence with at least one token after it.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> start of its latest occurrence
        self._indexed_end = 0  # every n-gram inside tokens[:_indexed_end] is in _latest

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def continuation(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching
        suffix; [] when nothing matches (same result as `ngram_continuation`)."""
        return self.match(k)[0]

    def match(self, k: int) -> tuple[list[int], int]:
        """(continuation, n): `continuation(k)` and the length of the suffix that matched (0: none)."""
        if k <= 0:
            return [], 0
        self._catch_up()
        length = len(self.tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            start = self._latest.get(tuple(self.tokens[length - n :]))
            if start is not None:
                return self.tokens[start + n : start + n + k], n
        return [], 0

    def _catch_up(self) -> None:
        """Index the n-grams ending at positions up to (excluding) the last token."""
        tokens, end = self.tokens, len(self.tokens) - 1
        for stop in range(self._indexed_end + 1, end + 1):
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                self._latest[tuple(tokens[stop - n : stop])] = stop - n
        self._indexed_end = max(self._indexed_end, end)


class ContextLookup:
    """Prompt lookup over the running requests' own tokens and their scopes' finished outputs,
    matches of `min_n` (default `config.min_n`) to `config.max_n` tokens."""

    def __init__(self, config: NgramConfig, min_n: int | None = None) -> None:
        self.config, self.min_n = config, config.min_n if min_n is None else min_n
        self._indexes: dict[str, NgramIndex] = {}  # per running request
        self.store = SuffixStore(config.store_tokens, self.min_n, config.max_n) if config.store_tokens else None

    def find(self, request: Request, k: int) -> tuple[list[int], tuple[int, bool]]:
        """The longer match of the request's own tokens and its scope's stored outputs (own on a
        tie): (up to k tokens, (match length, from the store)); ([], (0, False)) where none."""
        index = self._index(request)
        own, n = index.match(k)
        scope = self._scope(request)
        if self.store is not None and scope is not None and k > 0:
            found = self.store.lookup(scope, index.tokens[-self.store.max_n :], k)
            if found is not None and found.match_len > n and found.tokens:
                return found.tokens, (found.match_len, True)
        return own, (n, False)

    def release(self, request: Request) -> None:
        """The request left the batch: drop its index, and store its output if it completed."""
        self._indexes.pop(request.request_id, None)
        scope = self._scope(request)
        if self.store is not None and scope is not None and request.status in _COMPLETED:
            context = request.prompt_token_ids[-self.store.max_n :]
            self.store.add(scope, context + request.output_token_ids)

    def _scope(self, request: Request) -> str | None:
        """Whose stored outputs the request may match: its user's (None: nobody's), or everyone's."""
        return SHARED_SCOPE if self.config.share_store else request.user

    def _index(self, request: Request) -> NgramIndex:
        """The request's index, fed the tokens added since it last looked (a new one where the
        request is shorter than its index)."""
        index = self._indexes.get(request.request_id)
        if index is None or len(index.tokens) > request.num_tokens:
            index = self._indexes[request.request_id] = NgramIndex(self.min_n, self.config.max_n)
        index.extend(request.token_slice(len(index.tokens), request.num_tokens))
        return index


def ngram_continuation(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest matching
    suffix of `tokens` (length n_max down to n_min); [] when nothing matches. The reference
    scan `NgramIndex` is tested against."""
    if k <= 0:
        return []
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # [L - n, n]
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []
