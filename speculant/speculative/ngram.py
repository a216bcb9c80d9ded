"""Prompt-lookup decoding: propose what followed the latest earlier match of the sequence's last
n tokens (n from `ngram.max_n` down to `ngram.min_n`). No model, no KV: the draft is one-hot."""

from __future__ import annotations

import numpy as np

from speculant.core import Batch, DraftProposal
from speculant.executor.plan import Forwards
from speculant.speculative.base import Proposer, pad_proposals


class NgramProposer(Proposer):
    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        ngram = self.ctx.speculative.ngram
        drafts = [
            ngram_continuation(np.asarray(r.all_token_ids), self.num_draft_tokens(r), ngram.min_n, ngram.max_n)
            for r in batch.requests
        ]
        yield from ()  # a lookup, no model forward
        return pad_proposals(drafts)


def ngram_continuation(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest matching
    suffix of `tokens` (length n_max down to n_min); [] when nothing matches."""
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
