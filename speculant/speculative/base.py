"""The proposer interface every speculative method implements, and the null proposer.

The engine calls, per step: `speculates(batch)` to choose a speculative step (decode batches only),
`propose(batch)` for draft tokens, and after tokens are committed `on_commit(batch, ...)` so the
proposer's own state (a draft model's KV, carried logits) follows the sequence. Method-specific
logic lives in the subclasses; the engine never asks which method it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from speculant.config import ModelConfig, SpeculativeConfig
from speculant.core import Batch, DraftProposal, Request
from speculant.kv_cache.allocator import PageTables

if TYPE_CHECKING:
    from speculant.executor.model_runner import ModelRunner


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may use of its engine."""

    speculative: SpeculativeConfig
    model: ModelConfig  # the target's settings (dtype, device, attention backend) for draft models
    target: ModelRunner
    device: torch.device
    generator: torch.Generator  # engine-wide default for requests without a seed
    draft_checkpoint: Any = None  # a loaded draft checkpoint (tests); else speculative.draft.model is loaded


class Proposer(ABC):
    def __init__(self, ctx: ProposerContext) -> None:
        self.ctx = ctx
        self.pages: PageTables | None = None

    def bind(self, pages: PageTables) -> None:
        """The engine's page tables, once the cache (sized with `runners`) exists."""
        self.pages = pages

    @property
    def runners(self) -> list[ModelRunner]:
        """Models that keep K/V in the engine's shared pages (counted in the page budget)."""
        return []

    def memory_bytes(self, max_num_seqs: int) -> dict[str, int]:
        """Bytes this proposer keeps or allocates per step beyond its runners' weights and K/V,
        by memory-plan item (`speculant.engine.memory.MemoryPlan` fields)."""
        return {}

    def num_draft_tokens(self, request: Request) -> int:
        """k for this request this step: the engine's, or the request's own when lower, cut so
        that the drafts (and a fed bonus token) stay inside the model's context and the whole
        KV cache."""
        k = self.ctx.speculative.num_draft_tokens
        if request.params.num_draft_tokens is not None:  # may lower k, never raise it past the memory plan's
            k = min(k, request.params.num_draft_tokens)
        limit = self.ctx.target.arch.max_position
        if self.pages is not None:
            limit = min(limit, self.pages.allocator.num_pages * self.pages.page_size)
        return max(0, min(k, limit - request.num_tokens - 1))

    def lookahead_slots(self, request: Request) -> int:
        """KV slots past the sequence's tokens that a step may write (drafts being verified)."""
        return self.num_draft_tokens(request)

    def speculates(self, batch: Batch) -> bool:
        return batch.is_decode and any(self.num_draft_tokens(r) > 0 for r in batch.requests)

    @abstractmethod
    def propose(self, batch: Batch) -> DraftProposal:
        """Draft tokens for every sequence of a decode batch (k_i may be 0)."""

    def on_commit(self, batch: Batch, hidden: torch.Tensor | None) -> None:
        """Called after a step's tokens are appended to the live requests of `batch`;
        `hidden` [T, hidden] holds the target's last-layer states of that step's forward."""

    def release(self, request: Request) -> None:
        """The request finished, was aborted or preempted: drop its proposer state."""


class NoProposer(Proposer):
    """Plain decoding: never speculates."""

    def num_draft_tokens(self, request: Request) -> int:
        return 0

    def propose(self, batch: Batch) -> DraftProposal:
        raise RuntimeError("NoProposer never proposes")


def pad_proposals(drafts: list[list[int]]) -> DraftProposal:
    """A one-hot DraftProposal from per-sequence token lists."""
    k_max = max((len(d) for d in drafts), default=0)
    tokens = np.full((len(drafts), k_max), -1, dtype=np.int64)
    for b, d in enumerate(drafts):
        tokens[b, : len(d)] = d
    return DraftProposal(token_ids=torch.from_numpy(tokens), num_drafts=[len(d) for d in drafts])
