"""The proposer interface every speculative method implements, and the null proposer.

Proposers decide; the executor executes. A proposer declares the models it needs once
(`model_specs`: the executor loads and owns them, their K/V in the engine's pages), and per step
the engine asks `speculates(batch)` (decode batches only), drives `propose(batch)` for draft
tokens and, after the step's tokens are committed, drives `update(step_result)` so the
proposer's own state (a draft model's KV, carried logits) follows the sequences. `propose` and
`update` are generators of `ForwardPlan`s: the executor runs each plan and sends the result back.
Method-specific logic lives in the subclasses; the engine never asks which method it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from speculant.config import ArchConfig, ModelConfig, SpeculativeConfig
from speculant.core import Batch, DraftProposal, Request, StepResult
from speculant.executor.plan import Forwards, ModelSpec
from speculant.kv_cache.allocator import PageTables


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may use of its engine."""

    speculative: SpeculativeConfig
    model: ModelConfig  # the target's settings (dtype, device, attention backend) for draft models
    target_arch: ArchConfig  # the target's vocabulary size and context length
    device: torch.device
    generator: torch.Generator  # engine-wide default for requests without a seed
    draft_checkpoint: Any = None  # a loaded draft checkpoint (tests); else speculative.draft.model is loaded


class Proposer(ABC):
    def __init__(self, ctx: ProposerContext) -> None:
        self.ctx = ctx
        self.pages: PageTables | None = None

    def model_specs(self) -> list[ModelSpec]:
        """Models the executor must load and run for this proposer (K/V in the shared pages)."""
        return []

    def bind(self, pages: PageTables) -> None:
        """The engine's page tables, once the cache (sized over every model) exists."""
        self.pages = pages

    def memory_bytes(self, max_num_seqs: int) -> dict[str, int]:
        """Bytes this proposer keeps or allocates per step beyond its models' weights and K/V,
        by memory-plan item (`speculant.engine.memory.MemoryPlan` fields)."""
        return {}

    def num_draft_tokens(self, request: Request) -> int:
        """k for this request this step: the engine's, or the request's own when lower, cut so
        that the drafts (and a fed bonus token) stay inside the model's context and the whole
        KV cache."""
        k = self.ctx.speculative.num_draft_tokens
        if request.params.num_draft_tokens is not None:  # may lower k, never raise it past the memory plan's
            k = min(k, request.params.num_draft_tokens)
        limit = self.ctx.target_arch.max_position
        if self.pages is not None:
            limit = min(limit, self.pages.allocator.num_pages * self.pages.page_size)
        return max(0, min(k, limit - request.num_tokens - 1))

    def lookahead_slots(self, request: Request) -> int:
        """KV slots past the sequence's tokens that a step may write (drafts being verified)."""
        return self.num_draft_tokens(request)

    def speculates(self, batch: Batch) -> bool:
        return batch.is_decode and any(self.num_draft_tokens(r) > 0 for r in batch.requests)

    @abstractmethod
    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        """Draft tokens for every sequence of a decode batch (k_i may be 0), planning any model
        forwards it needs through the executor."""

    def update(self, result: StepResult) -> Forwards[None]:
        """Called after a step's tokens are appended to the live requests of `result.requests`."""
        yield from ()

    def release(self, request: Request) -> None:
        """The request finished, was aborted or preempted: drop its proposer state."""


class NoProposer(Proposer):
    """Plain decoding: never speculates."""

    def num_draft_tokens(self, request: Request) -> int:
        return 0

    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        raise RuntimeError("NoProposer never proposes")


def pad_proposals(drafts: list[list[int]]) -> DraftProposal:
    """A one-hot DraftProposal from per-sequence token lists."""
    k_max = max((len(d) for d in drafts), default=0)
    tokens = np.full((len(drafts), k_max), -1, dtype=np.int64)
    for b, d in enumerate(drafts):
        tokens[b, : len(d)] = d
    return DraftProposal(token_ids=torch.from_numpy(tokens), num_drafts=[len(d) for d in drafts])
