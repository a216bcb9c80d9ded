"""MTP speculation: a draft head on the target's hidden states proposes k tokens (DeepSeek-V3's
MTP schedule, the Sonar speculation design).

Head entry i of a sequence (its KV slot i) reads the target's hidden state h_i and the embedding
of t_{i+1}; its output predicts t_{i+2}. The schedule:

- every target forward is followed, before the host reads anything (`launch`), by one head run
  over the forward's rows with the target's states: a prefill chunk's entries (the sampled first
  token as the last entry's input), or every verified position of a speculative step, rejected
  ones included (their tokens: the accepted drafts, then the bonus token at the first rejected
  slot). The logits and state at each sequence's last valid entry are gathered on the device
  (row offset + accepted count) and carried into the next step; work on rejected rows is wasted
  but needs no device-to-host read to know which rows to keep, and their KV is overwritten next
  step;
- `propose` takes the first draft from the carried logits and, for k > 1, runs the head on its own
  output state and the draft just chosen, entry after entry.

With adaptive k the head follows lazily (`LAZY_FEED`): a request that did not draft this step
keeps the target's states of its rows (at most `BACKLOG_ROWS`, then they are run) instead of
running the head on them, and a request that drafts again runs its backlog first (`_catch_up`; the
tokens are on the host by then). A step where nobody drafts then costs what a plain step costs,
so a head whose drafts do not pay is not paid for either.

Drafts are the head's argmax (a one-hot q) or samples from its processed distribution
(`head_sampling`); the acceptance rule is the engine's, lossless for both.

With `head_lookup` = m, a request whose last n >= m tokens occurred before drafts what followed
them (prompt lookup, one-hot: `speculant.speculative.lookup`) in place of the head's chain: copies
from a document or from the answer's own repeats, where the head is right least, and no head
forward. Adaptive k keys their acceptance by the match length, apart from the head's. With the
head following lazily, a copied step's rows join the request's backlog (cut to its verified rows
once the host knows them, `update`), so a copy costs what an n-gram draft costs.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from speculant.attention.batch import SeqInput
from speculant.core import Batch, DraftProposal, Request, StepResult
from speculant.executor.plan import TARGET, ForwardPlan, Forwards, ModelSpec
from speculant.speculative.base import Proposer, ProposerContext
from speculant.speculative.drafts import chain_work, choose_drafts, pad_proposals
from speculant.speculative.head_rows import chunk_inputs, verified_inputs
from speculant.speculative.lookup import ContextLookup

HEAD = "head"  # the head's name in the executor
BACKLOG_ROWS = 64  # target states a request keeps for its head before running it anyway


class MtpProposer(Proposer):
    LAZY_FEED = True  # with adaptive k the head follows only requests that draft (see the module doc)
    COPIES = True  # a chain may draft prompt lookup's copies (`head_lookup`); a tree grows from the head alone

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self.pending: dict[str, tuple[int, list[torch.Tensor]]] = {}  # request id -> (first position, [[n_i, hidden_in]] target states, step by step)
        self.carried: dict[str, torch.Tensor] = {}  # request id -> [V] head logits for the next draft
        self.state: dict[str, torch.Tensor] = {}  # request id -> [hidden] head output at that entry
        self._drafts: torch.Tensor | None = None  # [B, k_max] the step's proposal (device)
        copies = ctx.speculative.head.lookup if self.COPIES else 0  # the shortest match copied (0: the head alone)
        self.lookup = ContextLookup(ctx.speculative.ngram, copies) if copies else None  # over its own tokens and its user's outputs
        self._copies: dict[str, list[int]] = {}  # request id -> tokens the lookup offers this step
        self._planned: list[str] = []  # request ids of the step being planned, in batch order

    def model_specs(self) -> list[ModelSpec]:
        from speculant.loader.head_file import default_head

        head, checkpoint = self.ctx.speculative.head, self.ctx.draft_checkpoint
        own = head.path is None and checkpoint is None and self.ctx.target_arch.mtp_layers > 0
        if head.path is not None or checkpoint is not None:
            path = head.path or "<in memory>"
        else:
            path = "<the target's MTP layer>" if own else str(default_head(self.ctx.model.model, self.ctx.target_features))
        config = dataclasses.replace(self.ctx.model, model=path)
        return [ModelSpec(HEAD, config, checkpoint, head_of=TARGET, own_head=own)]

    def memory_bytes(self, max_num_seqs: int) -> dict[str, int]:
        """Carried logits [B, V] fp32; sampled drafts' probabilities [B, k, V] fp32; the lazy
        head's backlogs [B, BACKLOG_ROWS, hidden_in] fp32 (hidden_in: up to three layers' states)."""
        row = self.ctx.target_arch.vocab_size * 4
        sampled = self.ctx.speculative.head.sampling == "sample"
        k = self.ctx.speculative.num_draft_tokens
        return {"draft_logits": max_num_seqs * row, "draft_probs": max_num_seqs * k * row if sampled else 0, "head_backlog": self.backlog_bytes(max_num_seqs)}

    def backlog_bytes(self, max_num_seqs: int) -> int:
        """[B, BACKLOG_ROWS, hidden_in] fp32 target states waiting (hidden_in: up to three layers')."""
        return max_num_seqs * BACKLOG_ROWS * 3 * self.ctx.target_arch.hidden_size * 4 if self.follows_lazily() else 0

    def draft_work(self, ks) -> tuple[int, int]:
        """The first draft comes from carried logits (`chain_work`); copies run no head forward."""
        return chain_work(self._head_ks(ks))

    def fed_requests(self, ks) -> int:
        """A lazily following head is fed the requests it drafted for, not the ones that copied."""
        return super().fed_requests(self._head_ks(ks))

    def _head_ks(self, ks):
        """ks with the copying requests' at 0 (ks of the step being planned, in batch order)."""
        if not self._copies or len(ks) != len(self._planned):
            return ks
        return [0 if i in self._copies else k for i, k in zip(self._planned, ks)]

    def speculates(self, batch) -> bool:
        self._copies, self._planned = {}, [r.request_id for r in batch.requests]
        drafting = super().speculates(batch)
        if drafting and self.lookup is not None and self.adaptive is None:  # fixed k: copy wherever a match offers
            offers = {r.request_id: self.offer(r, self.step_k(r))[0] for r in batch.requests}
            self._step_ks |= {i: offers[i] for i in self._copies}
        return drafting

    def offer(self, request: Request, k: int):
        """k head drafts (kind None), or with `head_lookup` the tokens that followed the longest
        earlier match of at least that many tokens, in the request's own tokens or its user's
        finished outputs (`ContextLookup`; kind: the match length and where it was found)."""
        if self.lookup is None or k <= 0:
            return k, None
        tokens, (n, stored) = self.lookup.find(request, k)
        if tokens:
            self._copies[request.request_id] = tokens
        return (len(tokens), ("copy", n, stored)) if tokens else (k, None)

    def release(self, request: Request) -> None:
        super().release(request)
        self.carried.pop(request.request_id, None)
        self.state.pop(request.request_id, None)
        self.pending.pop(request.request_id, None)
        if self.lookup is not None:
            self.lookup.release(request)

    def follows_lazily(self) -> bool:
        """Whether the head may leave a request's rows waiting (adaptive k chooses the drafts)."""
        return self.LAZY_FEED and self.adaptive is not None

    def backlog(self, request: Request) -> int:
        """Rows the head must run before it can draft for the request."""
        pending = self.pending.get(request.request_id)
        return 0 if pending is None else sum(rows.shape[0] for rows in pending[1])

    # ---- after every target forward ---------------------------------------------------------------

    def launch(self, result: StepResult) -> Forwards[None]:
        """The head over the target forward's rows, with the target's states; no host reads."""
        run = self._followed(result)
        if run:
            yield from self.timed_feed(self._launch(result, run), len(run))

    def _launch(self, result: StepResult, run: list[int]) -> Forwards[None]:
        device = result.hidden_states.device
        offsets, starts = result.row_offsets, result.kv_starts
        if result.speculative:  # each sequence's last accepted row, chosen on the device
            tokens = verified_inputs(self._drafts, result)
            last = torch.tensor(offsets[:-1], device=device) + result.num_accepted  # [B]
        else:  # each sequence's last row
            tokens = chunk_inputs(result)
            last = torch.tensor(offsets[1:], device=device) - 1  # [B]
        if len(run) == len(result.requests) and not self.pending:  # every request, nothing behind: the step's rows as they are
            hidden = result.hidden_states
            inputs = [SeqInput([0] * (offsets[b + 1] - offsets[b]), starts[b], self.pages.table(r.request_id), logits="none") for b, r in enumerate(result.requests)]
        else:  # the requests that run, each after its backlog
            parts, inputs, shift = [], [], []
            for b in run:
                r, rows = result.requests[b], torch.arange(offsets[b], offsets[b + 1], device=device)
                behind = self.pending.pop(r.request_id, None)
                first, states, ids = starts[b], result.hidden_states.index_select(0, rows), tokens.index_select(0, rows)
                if behind is not None:
                    first = behind[0]
                    states, ids = torch.cat([*behind[1], states]), torch.cat([self._host_tokens(r, first, starts[b]), ids])
                parts.append((states, ids))
                shift.append(sum(len(x.token_ids) for x in inputs) + starts[b] - first - offsets[b])
                inputs.append(SeqInput([0] * states.shape[0], first, self.pages.table(r.request_id), logits="none"))
            index = torch.tensor(run, device=device)
            hidden, tokens = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            last = last.index_select(0, index) + torch.tensor(shift, device=device)  # [len(run)] in the new layout
        out = yield ForwardPlan(HEAD, inputs, input_ids=tokens, hidden_states=hidden, logits_rows=last)
        logits = out.logits  # [len(run), V] at the rows `last`
        states = out.hidden.index_select(0, last)
        for i, b in enumerate(run):
            r = result.requests[b]
            self.carried[r.request_id], self.state[r.request_id] = logits[i], states[i]

    def _followed(self, result: StepResult) -> list[int]:
        """The batch positions whose rows the head runs now; the others' target states wait in
        `pending` (lazy feed: a request that did not draft, its backlog within BACKLOG_ROWS)."""
        if not self.follows_lazily():
            return list(range(len(result.requests)))
        run = []
        for b, r in enumerate(result.requests):
            n = result.row_offsets[b + 1] - result.row_offsets[b]
            waiting = self.backlog(r)
            head_drafted = result.speculative and n > 1 and r.request_id not in self._copies
            if head_drafted or waiting + n > BACKLOG_ROWS:  # a copied step's rows wait (`update` cuts them)
                run.append(b)
                continue
            rows = result.hidden_states[result.row_offsets[b] : result.row_offsets[b + 1]].clone()  # the step's buffer is reused
            first, kept = self.pending.setdefault(r.request_id, (result.kv_starts[b], []))
            assert first + waiting == result.kv_starts[b], "a head backlog with a gap"
            kept.append(rows)
        return run

    def update(self, result: StepResult) -> Forwards[None]:
        """After a speculative step, the rows each request left waiting (`_followed`: this step's,
        its last) are cut to its verified ones, the last token and the accepted drafts: a copied
        step's rejected rows are not the sequence's (a request that did not draft kept one row)."""
        if result.speculative and self.pending:
            for b, r in enumerate(result.requests):
                pending = self.pending.get(r.request_id)
                if pending is not None and len(pending[1][-1]) > result.accepted_counts[b] + 1:
                    pending[1][-1] = pending[1][-1][: result.accepted_counts[b] + 1]
        yield from ()

    def _host_tokens(self, r: Request, start: int, end: int) -> torch.Tensor:
        """[end - start] the inputs of head entries start..end-1: t_{i+1}, all on the host by now."""
        return torch.tensor(r.token_slice(start + 1, end + 1), dtype=torch.int64).to(self.ctx.device, non_blocking=True)

    def _catch_up(self, behind: list[Request]) -> Forwards[None]:
        """Run the backlogs of requests about to draft, one forward of at most the token budget
        at a time, and tell adaptive k the time (it prices long backlogs per row)."""
        start, budget, total, used = time.perf_counter(), self.ctx.max_num_batched_tokens, 0, 0
        groups: list[list[Request]] = [[]]
        for r in behind:
            n = self.backlog(r)
            if groups[-1] and used + n > budget:
                groups.append([])
                used = 0
            groups[-1].append(r)
            used, total = used + n, total + n
        for group in groups:
            pending = [(first, torch.cat(kept)) for first, kept in (self.pending.pop(r.request_id) for r in group)]
            inputs = [SeqInput([0] * h.shape[0], first, self.pages.table(r.request_id), logits="none") for r, (first, h) in zip(group, pending)]
            ids = torch.cat([self._host_tokens(r, first, first + h.shape[0]) for r, (first, h) in zip(group, pending)])
            ends = torch.tensor(list(itertools.accumulate(h.shape[0] for _, h in pending)), device=ids.device) - 1
            out = yield ForwardPlan(HEAD, inputs, input_ids=ids, hidden_states=torch.cat([h for _, h in pending]), logits_rows=ends)
            states = out.hidden.index_select(0, ends)
            for i, r in enumerate(group):
                self.carried[r.request_id], self.state[r.request_id] = out.logits[i], states[i]
        if self.adaptive is not None:
            self.adaptive.record_catch_up(time.perf_counter() - start, total, len(behind))

    # ---- drafting -------------------------------------------------------------------------------

    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        requests = batch.requests
        ks = [self.step_k(r) for r in requests]
        head_ks = self._head_ks(ks)
        behind = [r for r, k in zip(requests, head_ks) if k > 0 and r.request_id in self.pending]
        if behind:  # requests the head did not follow (lazy feed) run their backlogs first
            yield from self._catch_up(behind)
        start = time.perf_counter()
        device, k_max = self.ctx.device, max(ks)
        tokens = torch.full((len(requests), k_max), -1, dtype=torch.int64, device=device)
        sampled = self.ctx.speculative.head.sampling == "sample"
        probs = torch.zeros(len(requests), k_max, self.ctx.target_arch.vocab_size, device=device) if sampled else None
        if any(head_ks):
            yield from self._head_chain(requests, head_ks, tokens, probs)
        copies = [self._copies[r.request_id][:k] if k > h else [] for r, k, h in zip(requests, ks, head_ks)]
        if any(copies):  # one-hot drafts (q = 1 at the copied token)
            copied = pad_proposals(copies, device).token_ids  # [B, k_c], -1 where a request did not copy
            width, found = copied.shape[1], copied >= 0
            tokens[:, :width] = torch.where(found, copied, tokens[:, :width])
            if probs is not None:
                probs[:, :width].scatter_add_(2, copied.clamp(min=0)[..., None], found[..., None].to(probs.dtype))
        self._drafts = tokens
        if self.adaptive is not None:
            self.adaptive.record_draft_time(time.perf_counter() - start, self.draft_work(ks))
        return DraftProposal(token_ids=tokens, num_drafts=ks, draft_probs=probs)

    def _head_chain(self, requests: list[Request], ks: list[int], tokens: torch.Tensor, probs: torch.Tensor | None) -> Forwards[None]:
        """The head's drafts into `tokens` [B, k_max] (and `probs` [B, k_max, V] when sampled):
        the first from the carried logits, each next from the head run on its own output state."""
        first = next(r.request_id for r, k in zip(requests, ks) if k > 0)
        keep = [r.request_id if k > 0 else first for r, k in zip(requests, ks)]  # k = 0 rows: unused stand-ins
        logits = torch.stack([self.carried[i] for i in keep])  # [B, V]
        state = torch.stack([self.state[i] for i in keep])  # [B, hidden]
        device, sampled = logits.device, probs is not None
        for j in range(max(ks)):
            rows = [b for b, k in enumerate(ks) if k > j]
            drafted, q = choose_drafts(logits[rows], [requests[b] for b in rows], sampled, self.ctx.generator, offset=j)
            index = torch.tensor(rows, device=device)
            tokens[:, j].index_copy_(0, index, drafted)
            if q is not None:
                probs[:, j].index_copy_(0, index, q)
            feed = [i for i, b in enumerate(rows) if ks[b] > j + 1]  # the last draft is not fed
            if feed:
                fed = [rows[i] for i in feed]
                inputs = [SeqInput([0], requests[b].num_tokens - 1 + j, self.pages.table(requests[b].request_id)) for b in fed]
                fed_index = torch.tensor(fed, device=device)
                plan = ForwardPlan(HEAD, inputs, input_ids=drafted[feed], hidden_states=state.index_select(0, fed_index))
                out = yield plan
                logits.index_copy_(0, fed_index, out.logits)
                state.index_copy_(0, fed_index, out.hidden)
