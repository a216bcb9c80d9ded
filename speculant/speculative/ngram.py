"""Prompt-lookup decoding: propose what followed the latest earlier match of the sequence's last
n tokens (n from `ngram.max_n` down to `ngram.min_n`), in the request's own tokens or its user's
finished outputs (`speculant.speculative.lookup`). No model, no KV: the draft is one-hot."""

from __future__ import annotations

from speculant.core import Batch, DraftProposal, Request
from speculant.executor.plan import Forwards
from speculant.speculative.base import Proposer, ProposerContext
from speculant.speculative.drafts import pad_proposals
from speculant.speculative.lookup import ContextLookup


class NgramProposer(Proposer):
    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self.lookup = ContextLookup(ctx.speculative.ngram)
        self._offered: dict[str, list[int]] = {}  # request id -> tokens `offer` found this step

    def offer(self, request: Request, k: int) -> tuple[int, tuple[int, bool]]:
        """The lookup, done before k is chosen: (tokens found, (match length, from the store))."""
        tokens, key = self.lookup.find(request, k)
        self._offered[request.request_id] = tokens
        return len(tokens), key

    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        drafts = []
        for r in batch.requests:
            k = self.step_k(r)
            offered = self._offered.pop(r.request_id, None)
            drafts.append(offered[:k] if offered is not None else self.lookup.find(r, k)[0])
        self._offered.clear()
        yield from ()  # a lookup, no model forward
        return pad_proposals(drafts, self.ctx.device)

    def release(self, request: Request) -> None:
        super().release(request)
        self.lookup.release(request)
        self._offered.pop(request.request_id, None)
