"""The proposer interface every speculative method implements, and the null proposer.

Proposers decide; the executor executes. A proposer declares the models it needs once
(`model_specs`: the executor loads and owns them, their K/V in the engine's pages), and per step
the engine asks `speculates(batch)` (decode batches only; it fixes each request's k for the step,
`step_k`), drives `propose(batch)` for draft tokens and, after the step's tokens are committed,
drives `update(step_result)` so the proposer's own state (a draft model's KV, carried logits)
follows the sequences, then hands the step's time to `observe`. With `adaptive_k` the step's k's
are chosen from measured acceptance and cost by the policy in `speculant.speculative.adaptive`
(its cost prior measured and cached by `speculant.speculative.calibration`), with
`num_draft_tokens` as the upper bound. `propose` and `update` are generators of `ForwardPlan`s:
the executor runs each plan and sends the result back. Method-specific logic lives in the
subclasses (helpers they share: `speculant.speculative.drafts`); the engine never asks which
method it runs.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from speculant.config import ArchConfig, ModelConfig, SpeculativeConfig
from speculant.core import Batch, DraftProposal, Request, StepResult
from speculant.executor.plan import Forwards, ModelSpec
from speculant.kv_cache.allocator import PageTables
from speculant.speculative import calibration
from speculant.speculative.adaptive import AdaptiveK


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may use of its engine."""

    speculative: SpeculativeConfig
    model: ModelConfig  # the target's settings (dtype, device, attention backend) for draft models
    target_arch: ArchConfig  # the target's vocabulary size and context length
    device: torch.device
    generator: torch.Generator  # engine-wide default for requests without a seed
    draft_checkpoint: Any = None  # a loaded draft checkpoint (tests); else speculative.draft.model is loaded
    max_num_seqs: int = 64  # the scheduler's bound on sequences per step
    max_num_batched_tokens: int = 512  # the scheduler's token budget: rows one forward may hold (the memory plan's)
    target_features: bool = True  # the target can hand a head its feature layers' states (not under tensor parallelism)


T = TypeVar("T")


class Proposer(ABC):
    # With adaptive k: the proposer follows the tokens (`timed_feed`) only of requests that draft,
    # catching up when one drafts again, so a step where nobody drafts costs a plain step.
    LAZY_FEED = False

    def __init__(self, ctx: ProposerContext) -> None:
        self.ctx = ctx
        self.pages: PageTables | None = None
        self.adaptive = AdaptiveK(self.draft_work, fed=self.fed_requests) if ctx.speculative.adaptive_k else None
        self._step_ks: dict[str, int] = {}  # request id -> k of the decode step being taken

    def model_specs(self) -> list[ModelSpec]:
        """Models the executor must load and run for this proposer (K/V in the shared pages)."""
        return []

    def bind(self, pages: PageTables) -> None:
        """The engine's page tables, once the cache (sized over every model) exists."""
        self.pages = pages

    def calibrate(self) -> Forwards[None]:
        """Forwards to measure once at start-up, after `bind` (scratch pages, given back): with
        adaptive k, the step cost model's prior (`speculative.calibration`; cached per machine)."""
        if self.adaptive is None:
            return
        k, ctx = self.ctx.speculative.num_draft_tokens, self.ctx
        samples = yield from calibration.step_cost_samples(self.pages, ctx.model, ctx.target_arch, k, ctx.max_num_seqs)
        self.adaptive.use_calibration(samples)

    def stats(self) -> dict:
        """The proposer's own figures for `LLM.stats()` (e.g. a tree's chosen size)."""
        return {} if self.adaptive is None else self.adaptive.stats()

    def memory_bytes(self, max_num_seqs: int) -> dict[str, int]:
        """Bytes this proposer keeps or allocates per step beyond its models' weights and K/V,
        by memory-plan item (`speculant.engine.memory.MemoryPlan` fields)."""
        return {}

    def num_draft_tokens(self, request: Request) -> int:
        """k for this request this step: the engine's, or the request's own when lower, cut so
        that the drafts (and a fed bonus token) stay inside the model's context and the whole
        KV cache, and to the tokens max_tokens still allows after the bonus."""
        k = self.ctx.speculative.num_draft_tokens
        if request.params.num_draft_tokens is not None:  # may lower k, never raise it past the memory plan's
            k = min(k, request.params.num_draft_tokens)
        limit = self.ctx.target_arch.max_position
        if self.pages is not None:
            limit = min(limit, self.pages.allocator.num_pages * self.pages.page_size)
        allowance = request.params.max_tokens - len(request.output_token_ids) - 1
        return max(0, min(k, limit - request.num_tokens - 1, allowance))

    def lookahead_slots(self, request: Request) -> int:
        """KV slots past the sequence's tokens that a step may write (drafts being verified)."""
        return self.num_draft_tokens(request)

    def draft_work(self, ks: Sequence[int]) -> tuple[int, int]:
        """(draft forwards, rows over them) proposing these per-request k's runs (none for a lookup)."""
        return 0, 0

    def fed_requests(self, ks: Sequence[int]) -> int:
        """Requests the proposer follows after a step of these per-request k's (its refill):
        every one, or with `LAZY_FEED` those that draft."""
        return len(ks) - list(ks).count(0) if self.LAZY_FEED else len(ks)

    def speculates(self, batch: Batch) -> bool:
        """Fix every request's k for this step (`step_k`); False: a plain step (every k is 0)."""
        self._step_ks = {}
        if not batch.is_decode:
            if self.adaptive is not None:
                self.adaptive.not_decoding()
            return False
        if self.adaptive is None:
            ks = [self.num_draft_tokens(r) for r in batch.requests]
        else:
            ks = self.adaptive.plan(batch.requests, lambda r: self.offer(r, self.num_draft_tokens(r)), self.backlog)
        self._step_ks = {r.request_id: k for r, k in zip(batch.requests, ks)}
        return any(k > 0 for k in ks)

    def offer(self, request: Request, k: int) -> tuple[int, Hashable]:
        """(drafts this proposer can offer the request this step, at most k; their kind), asked
        before adaptive k chooses. The kind keys the acceptance evidence (a lookup proposer: the
        match length); a draft model can always offer k of one kind."""
        return k, None

    def backlog(self, request: Request) -> int:
        """Tokens the proposer must process before it can draft for the request (a lazily fed
        draft model's: the prompt, if it never drafted for it); adaptive k prices them."""
        return 0

    def step_k(self, request: Request) -> int:
        """The k this step drafts for the request (fixed by `speculates`)."""
        return self._step_ks.get(request.request_id, self.num_draft_tokens(request))

    def chosen_ks(self) -> list[int]:
        """Every request's k of the decode step being taken ([] on other steps)."""
        return list(self._step_ks.values())

    def observe(self, result: StepResult, seconds: float) -> None:
        """The step is committed and took `seconds` (wall time, proposing included)."""
        if self.adaptive is not None:
            self.adaptive.observe(result, seconds)

    @abstractmethod
    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        """Draft tokens for every sequence of a decode batch (k_i may be 0), planning any model
        forwards it needs through the executor."""

    def launch(self, result: StepResult) -> Forwards[None]:
        """Called right after acceptance, before the host reads the step's outcome: forwards
        planned here may use only device tensors of `result` (its `emitted_token_ids` are not
        known yet), so launching them costs no device-to-host read."""
        yield from ()

    def update(self, result: StepResult) -> Forwards[None]:
        """Called after a step's tokens are appended to the live requests of `result.requests`."""
        yield from ()

    def timed_feed(self, forwards: Forwards[T], requests: int) -> Forwards[T]:
        """Drive forwards that follow a step's tokens of `requests` requests (every decode step
        runs them, whatever its k's, unless `LAZY_FEED`), telling adaptive k their time: neither
        the target's nor a draft's."""
        start = time.perf_counter()
        value = yield from forwards
        if self.adaptive is not None:
            self.adaptive.record_feed_time(time.perf_counter() - start, requests)
        return value

    def release(self, request: Request) -> None:
        """The request finished, was aborted or preempted: drop its proposer state (subclasses
        call this too)."""
        if self.adaptive is not None:
            self.adaptive.release(request)


class NoProposer(Proposer):
    """Plain decoding: never speculates."""

    def num_draft_tokens(self, request: Request) -> int:
        return 0

    def speculates(self, batch: Batch) -> bool:
        return False

    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        raise RuntimeError("NoProposer never proposes")
