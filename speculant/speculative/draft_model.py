"""Draft-target speculation: a small LLM proposes k tokens, tightly coupled with the target.

The draft shares the engine's scheduler and page tables (its K/V lives in the same pages) and
stays one token ahead of the target: after every step it is fed the tokens it has not seen (the
prefill chunk and the sampled token, or the bonus/recovered token after verification), and the
logits of that run are carried into the next step to give the first draft token without another
draft forward (the Sonar speculation design). Drafts are the draft's argmax (a one-hot q) or
samples from its processed distribution. The executor owns and runs the draft model; this
class decides what it is fed and reads the results.
"""

from __future__ import annotations

import time

import torch

from speculant.attention.batch import SeqInput
from speculant.core import Batch, DraftProposal, Request, StepResult
from speculant.executor.plan import ForwardPlan, Forwards, ModelSpec
from speculant.speculative.base import Proposer, ProposerContext
from speculant.speculative.drafts import chain_work, choose_drafts

DRAFT = "draft"  # the draft model's name in the executor
SINKS = 4  # prompt tokens a windowed draft always reads (attention sinks)


class DraftModelProposer(Proposer):
    LAZY_FEED = True  # with adaptive k, the draft follows only requests that draft (prompt included); others catch up when they do

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self.computed: dict[str, int] = {}  # draft KV length per request
        self.carried: dict[str, torch.Tensor] = {}  # [V] draft logits for the next token

    def model_specs(self) -> list[ModelSpec]:
        config = self.ctx.speculative.draft.model_config(self.ctx.model)
        return [ModelSpec(DRAFT, config, self.ctx.draft_checkpoint)]

    def memory_bytes(self, max_num_seqs: int) -> dict[str, int]:
        """Carried logits [B, V] fp32 (one row per request, copied out of its feed's logits);
        sampled drafts' probabilities [B, k, V] fp32. The per-step stack of carried rows and the
        draft's sampling temporaries ([B, V]-sized) are smaller than the verify buffers that
        follow them, which the plan counts."""
        row = self.ctx.target_arch.vocab_size * 4
        sampled = self.ctx.speculative.draft.sampling == "sample"
        k = self.ctx.speculative.num_draft_tokens
        return {"draft_logits": max_num_seqs * row, "draft_probs": max_num_seqs * k * row if sampled else 0}

    def lookahead_slots(self, request: Request) -> int:
        """k verified slots, plus the bonus token the draft is fed after a full accept."""
        return self.num_draft_tokens(request) + 1

    def draft_work(self, ks) -> tuple[int, int]:
        """The first draft comes from carried logits, the last is not fed (`chain_work`)."""
        return chain_work(ks)

    def release(self, request: Request) -> None:
        super().release(request)
        self.computed.pop(request.request_id, None)
        self.carried.pop(request.request_id, None)

    def update(self, result: StepResult) -> Forwards[None]:
        """Feed the draft every token it lacks; rejected drafts' KV is dropped by the min(). With
        adaptive k only requests that verified drafts this step are fed: a prompt and plain
        (k = 0) steps are left behind, and `propose` catches a request up when it drafts (adaptive
        k prices that backlog), so a long prompt answered briefly never pays for a draft prefill."""
        lazy = self.LAZY_FEED and self.adaptive is not None
        feeds = []
        for b, r in enumerate(result.requests):
            drafted = result.speculative and result.row_offsets[b + 1] - result.row_offsets[b] > 1
            if r.finished or (lazy and not drafted):
                continue
            end = r.num_tokens if r.num_computed_tokens >= r.num_tokens - 1 else r.num_computed_tokens
            feeds += self._lacking(r, end)
        if feeds:
            yield from self.timed_feed(self._feed(feeds), len(feeds))

    def backlog(self, request: Request) -> int:
        """Tokens to feed before drafting for the request (0: its carried logits are current);
        prompt tokens outside the draft's window are not fed, so not counted."""
        if self.computed.get(request.request_id) == request.num_tokens:
            return 0
        return self._visible(request, self._valid(request), request.num_tokens)

    def _hidden(self, r: Request) -> tuple[int, int]:
        """Request positions [lo, hi) the draft never reads: with `draft.window` = W, a prompt of
        P > SINKS + W tokens hides [SINKS, P - W) (empty otherwise). The draft's K/V is compact:
        position p >= hi sits in slot p - (hi - lo); RoPE keeps p, so the draft reads the sinks and
        the window where a whole-prompt draft would see them."""
        window, n = self.ctx.speculative.draft.window, r.num_prompt_tokens
        if window is None or n <= SINKS + window:
            return 0, 0
        return SINKS, n - window

    def _visible(self, r: Request, start: int, end: int) -> int:
        lo, hi = self._hidden(r)
        return end - start - max(0, min(end, hi) - max(start, lo))

    def _input(self, r: Request, tokens: list[int], start: int) -> SeqInput | None:
        """The draft's forward input for request tokens [start, start + len(tokens)), its hidden
        positions left out (None: all hidden)."""
        lo, hi = self._hidden(r)
        table = self.pages.table(r.request_id)
        if hi == lo:
            return SeqInput(tokens, start, table)
        end = start + len(tokens)
        kept = [p for p in range(start, end) if not lo <= p < hi]
        if not kept:
            return None
        slot = start if start <= lo else max(lo, start - (hi - lo))  # the draft's K/V length before them
        return SeqInput([tokens[p - start] for p in kept], slot, table, positions=kept)

    def _valid(self, r: Request) -> int:
        """Draft KV that still holds: drafted KV past the last emitted token was rejected."""
        return min(self.computed.get(r.request_id, 0), r.num_tokens - 1)

    def _lacking(self, r: Request, end: int) -> list[tuple[Request, list[int], int]]:
        """(request, tokens the draft has not seen up to `end`, their KV start), if any."""
        valid = self._valid(r)
        return [(r, r.token_slice(valid, end), valid)] if end > valid else []

    def _feed(self, feeds: list[tuple[Request, list[int], int]], input_ids: torch.Tensor | None = None) -> Forwards[torch.Tensor]:
        """One draft forward over each (request, new tokens, KV start); the logits [len(feeds), V]
        of each sequence's last token are carried. `input_ids` [T]: device tokens read instead of
        the feeds' (whose lengths still lay out the batch)."""
        inputs = [self._input(r, tokens, start) for r, tokens, start in feeds]
        fed = [(f, x) for f, x in zip(feeds, inputs) if x is not None]  # a chunk wholly outside a draft window runs nothing
        for r, tokens, start in feeds:
            self.computed[r.request_id] = start + len(tokens)
        if not fed:
            return None
        logits = (yield ForwardPlan(DRAFT, [x for _, x in fed], input_ids=input_ids)).logits
        for b, ((r, _, _), _) in enumerate(fed):
            self.carried[r.request_id] = logits[b].clone()  # a view would keep all feed rows alive
        return logits

    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        """k drafts per sequence, all on the device: each draft is fed back as a device token, so
        drafting reads nothing on the host."""
        requests, device = batch.requests, self.ctx.device
        ks = [self.step_k(r) for r in requests]
        behind = [f for r, k in zip(requests, ks) if k > 0 and self.backlog(r) for f in self._lacking(r, r.num_tokens)]
        if behind:  # requests left behind (lazy feed) catch up: their carried logits are stale or missing
            yield from self._catch_up(behind)
        start = time.perf_counter()
        k_max = max(ks)
        tokens = torch.full((len(requests), k_max), -1, dtype=torch.int64, device=device)
        probs = None
        if self.ctx.speculative.draft.sampling == "sample":
            probs = torch.zeros(len(requests), k_max, self.ctx.target_arch.vocab_size, device=device)
        first = next(self.carried[r.request_id] for r, k in zip(requests, ks) if k > 0)
        logits = torch.stack([self.carried[r.request_id] if k > 0 else first for r, k in zip(requests, ks)]).float()  # [B, V]; k = 0 rows unused
        for j in range(k_max):
            rows = [b for b, k in enumerate(ks) if k > j]
            index = torch.tensor(rows, device=device)
            drafted = self._choose(logits.index_select(0, index), [requests[b] for b in rows], probs, index, j)
            tokens[:, j].index_copy_(0, index, drafted)
            feed = [i for i, b in enumerate(rows) if ks[b] > j + 1]  # the last draft is not fed
            if feed:
                fed = [rows[i] for i in feed]
                feeds = [(requests[b], [0], self.computed[requests[b].request_id]) for b in fed]
                fed_ids = drafted.index_select(0, torch.tensor(feed, device=device))
                out = yield from self._feed(feeds, fed_ids)
                logits.index_copy_(0, torch.tensor(fed, device=device), out.float())
        if self.adaptive is not None:
            self.adaptive.record_draft_time(time.perf_counter() - start, self.draft_work(ks))
        return DraftProposal(token_ids=tokens, num_drafts=ks, draft_probs=probs)

    def _catch_up(self, behind: list[tuple[Request, list[int], int]]) -> Forwards[None]:
        """Feed the backlogs in forwards of at most the token budget (tokens the draft reads: a
        draft window's hidden span rides along for free), a request's backlog split into chunks
        in order (a request whose backlog fills a forward has its next chunk in the next one), and
        tell adaptive k the time (it prices a long backlog per token)."""
        start, budget = time.perf_counter(), self.ctx.max_num_batched_tokens
        forwards: list[list[tuple[Request, list[int], int]]] = [[]]
        used, fed = 0, 0
        for r, tokens, kv_start in behind:
            lo, hi = self._hidden(r)
            end = kv_start + len(tokens)
            read = [p for p in range(kv_start, end) if not lo <= p < hi]
            cuts = [kv_start] + [read[i] + 1 for i in range(budget - 1, len(read) - 1, budget)] + [end]
            for a, b in zip(cuts, cuts[1:]):
                n = self._visible(r, a, b)
                if used + n > budget:
                    forwards.append([])
                    used = 0
                forwards[-1].append((r, tokens[a - kv_start : b - kv_start], a))
                used, fed = used + n, fed + n
        for feeds in forwards:
            yield from self._feed(feeds)
        if self.adaptive is not None:
            self.adaptive.record_catch_up(time.perf_counter() - start, fed, len(behind))

    def _choose(self, logits: torch.Tensor, requests: list[Request], probs, rows: torch.Tensor, j: int) -> torch.Tensor:
        tokens, q = choose_drafts(logits, requests, probs is not None, self.ctx.generator, offset=j)
        if q is not None:
            probs[:, j].index_copy_(0, rows, q)
        return tokens
