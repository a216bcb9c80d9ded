"""EAGLE tree speculation: a draft head grows a tree of candidates level by level; the target
verifies every node in one forward and keeps the longest acceptable path (Li et al. 2024,
EAGLE; EAGLE-2 for the dynamic tree).

The head and its schedule are MTP's (`speculant.speculative.mtp`): after every target forward
the head re-runs over the rows the sequence keeps with the target's states, before any host read
(here: the root and accepted path of the tree, `StepResult.accepted_rows`), and carries the
logits and state of the last one into the next step. Drafting grows the tree from there:

- level 1: the root's children come from the carried logits;
- level d > 1: one head forward over the nodes of level d - 1 that get children, each an entry
  reading its parent entry's output state and its own token, at RoPE position (root position
  + depth - 1), in KV slots after the sequence's (`base + e` for the step's e-th entry), with a
  tree mask: an entry sees the sequence's cached head entries and the entries of its ancestors.
  These entries are scratch: the next step's re-run overwrites them.

Shapes (`speculant.speculative.tree`): static (fixed child choices; children are the head's
best tokens, or drawn without replacement from its processed law with `head_sampling="sample"`)
or dynamic (EAGLE-2: expand the `topk` best frontier nodes by cumulative log-probability, keep
the best `num_draft_tokens` candidates at the end; the head's best tokens, so one-hot q).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from speculant.attention.batch import SeqInput
from speculant.core import Batch, DraftProposal, DraftTree, Request, StepResult
from speculant.executor.plan import ForwardPlan, Forwards
from speculant.sampling import tree_shape
from speculant.sampling.sampler import SamplingTensors, processed_probs
from speculant.speculative import tree
from speculant.speculative.base import ProposerContext
from speculant.speculative.mtp import HEAD, MtpProposer
from speculant.speculative.tree_budget import TreeBudget
from speculant.speculative.tree_calibration import measure_verify_seconds
from speculant.utils.sync import to_list


class EagleProposer(MtpProposer):
    COPIES = False  # a tree grows from the head alone (head_lookup: MTP chains)

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self.adaptive = None  # the tree's size is its budget; k per request is not chosen
        shape = ctx.speculative.tree
        self.dynamic = shape.shape == "dynamic"
        self.depth, self.topk = shape.depth, shape.topk
        self.sampled = ctx.speculative.head.sampling == "sample"
        if self.dynamic:
            self.budget = min(ctx.speculative.num_draft_tokens, self.topk + (self.depth - 1) * self.topk**2)
            self.num_entries = self.topk * (self.depth - 1)
        else:
            self.static = tree.static_parents(tree.static_choices(self.depth, self.topk, ctx.speculative.num_draft_tokens))
            self.budget = len(self.static[0])
            self.num_entries = sum(1 for kids in tree_shape.children(self.static[0])[1:] if kids)
        self.auto_budget = shape.auto_budget or ctx.speculative.adaptive_k  # adaptive k sizes the tree (0: a plain step)
        self.chooser: TreeBudget | None = None  # set by `calibrate` with auto_budget
        self.step_budget = self.budget  # nodes of this step's trees (budget, or the chooser's)
        self._tokens: torch.Tensor | None = None  # [B, n] the step's tree tokens (device)
        self._depths: list[int] = []  # [B] each tree's depth (0: no tree)
        self._sizes: list[int] = []  # [B] each tree's node count
        self._timed_budget: int | None = None  # the decode step's budget, for `observe`

    # ---- sizes --------------------------------------------------------------------------------

    def num_draft_tokens(self, request: Request) -> int:
        """The tree's node count, or 0 (a plain step) where the request asks for no drafts, or
        max_tokens allows no token past the bonus, or the tree and the head's entries would not
        fit the context or the cache. (`propose` cuts paths deeper than max_tokens allows.)"""
        return self.step_budget if self._may_draft(request) else 0

    def _may_draft(self, request: Request) -> bool:
        if request.params.num_draft_tokens == 0 or len(request.output_token_ids) + 1 >= request.params.max_tokens:
            return False
        limit = self.ctx.target_arch.max_position
        if self.pages is not None:
            limit = min(limit, self.pages.allocator.num_pages * self.pages.page_size)
        return limit - request.num_tokens - 1 >= self.lookahead

    @property
    def lookahead(self) -> int:
        return max(self.budget, self.num_entries)

    def lookahead_slots(self, request: Request) -> int:
        return self.lookahead if self._may_draft(request) else 0  # whatever this step's budget: it is chosen after the pages

    def memory_bytes(self, max_num_seqs: int) -> dict[str, int]:
        """Carried logits [B, V]; per level the head's logits [B, topk, V] and, sampled, the
        nodes' laws [B, n, V]; target laws of every node [B, n + 1, V] (all fp32)."""
        row = self.ctx.target_arch.vocab_size * 4
        sampled = self.budget * row if self.sampled else 0
        return {"draft_logits": max_num_seqs * row * (1 + self.topk), "draft_probs": max_num_seqs * (sampled + (self.budget + 1) * row),
                "head_backlog": self.backlog_bytes(max_num_seqs)}

    def follows_lazily(self) -> bool:
        """With a measured budget a step may verify no tree: the head then waits (`MtpProposer`)."""
        return self.auto_budget

    def draft_work(self, ks) -> tuple[int, int]:
        """Every level past the first is one head forward over every drafting request's frontier."""
        levels = self.depth - 1 if any(ks) else 0
        return levels, levels * (len(ks) - ks.count(0))

    # ---- tree size from measured cost -----------------------------------------------------------

    def calibrate(self) -> Forwards[None]:
        """With auto_budget: the verify cost of every tree size, measured once (`tree_calibration`)."""
        if not self.auto_budget:
            return
        seconds = yield from measure_verify_seconds(self.pages, self.ctx.target_arch.max_position, self.budget)
        self.chooser = TreeBudget(self.budget, seconds, self.depth)

    def speculates(self, batch: Batch) -> bool:
        if self.chooser is not None and batch.is_decode:
            self.step_budget = self.chooser.choose()
        speculative = super().speculates(batch)
        self._timed_budget = (self.step_budget if speculative else 0) if self.chooser is not None and batch.is_decode else None
        return speculative

    def observe(self, result: StepResult, seconds: float) -> None:
        """A decode step's whole time, by the budget it ran at (0: plain), for the chooser."""
        super().observe(result, seconds)
        if self._timed_budget is not None:
            self.chooser.record_step(self._timed_budget, seconds)
            self._timed_budget = None

    def update(self, result: StepResult) -> Forwards[None]:
        """With auto_budget: each verified tree's size and accepted path count for every budget."""
        if self.chooser is not None and result.accepted_paths is not None:  # read with the step's tokens
            for size, path in zip(self._sizes, result.accepted_paths):
                if size:
                    self.chooser.record_tree(size, path)
        yield from ()

    def stats(self) -> dict:
        out = {"tree": "dynamic" if self.dynamic else "static", "tree_budget": self.budget if self.chooser is None else self.chooser.chosen}
        if self.chooser is not None:
            out["tree_budget_max"] = self.budget
            out["verify_cost_s"] = {int(t): float(s) for t, s in zip(self.chooser.verify_t, self.chooser.verify_s)}
        return out

    # ---- drafting -----------------------------------------------------------------------------

    def propose(self, batch: Batch) -> Forwards[DraftProposal]:
        requests = batch.requests
        behind = [r for r in requests if r.request_id in self.pending]
        if behind:  # every backlog first: a tree step's launch runs each request's rows from its last
            yield from self._catch_up(behind)
        start = time.perf_counter()
        ks = [self.step_k(r) for r in requests]
        treed = [b for b, k in enumerate(ks) if k > 0]
        grow = self._grow_dynamic if self.dynamic else self._grow_static
        tokens, parents, probs = yield from grow([requests[b] for b in treed])
        device = tokens.device
        full = torch.full((len(requests), tokens.shape[1]), -1, dtype=torch.int64, device=device)
        index = torch.tensor(treed, device=device)
        full.index_copy_(0, index, tokens)
        full_probs = None
        if probs is not None:
            full_probs = torch.zeros(len(requests), *probs.shape[1:], device=device)
            full_probs.index_copy_(0, index, probs)
        all_parents: list[list[int]] = [[] for _ in requests]
        for i, b in enumerate(treed):
            all_parents[b] = parents[i]
            allowance = requests[b].params.max_tokens - len(requests[b].output_token_ids) - 1  # no path drafts past the last token
            tree.cut_row_to_depth(all_parents, full, full_probs, b, allowance)
        self._tokens, self._depths = full, [int(tree_shape.depths(p).max(initial=0)) for p in all_parents]
        self._sizes = [len(p) for p in all_parents]
        if self.chooser is not None:
            self.chooser.record_draft(time.perf_counter() - start, max(self._depths, default=1) - 1)
        return DraftProposal(full, [len(p) for p in all_parents], full_probs, DraftTree(all_parents))

    def _carried(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:  # [B, V], [B, hidden]
        return torch.stack([self.carried[r.request_id] for r in requests]), torch.stack([self.state[r.request_id] for r in requests])

    def _entries(
        self,
        requests: list[Request],
        tokens: torch.Tensor,  # [B, F] the nodes getting children
        states: torch.Tensor,  # [B, F, hidden] their parent entries' output states
        depth: int,  # their depth
        first_entry: int,  # the step's entry index of the first of them
        masks: list[np.ndarray],  # [B] [F, first_entry + F] each node's ancestor entries and itself
    ) -> Forwards[tuple[torch.Tensor, torch.Tensor]]:  # logits [B, F, V], states [B, F, hidden]
        num, width = tokens.shape
        inputs = [
            SeqInput([0] * width, r.num_tokens - 1 + first_entry, self.pages.table(r.request_id),
                     positions=[r.num_tokens - 2 + depth] * width, logits="all", tree_mask=mask)
            for r, mask in zip(requests, masks)
        ]
        out = yield ForwardPlan(HEAD, inputs, input_ids=tokens.reshape(-1), hidden_states=states.reshape(num * width, -1))
        return out.logits.view(num, width, -1), out.hidden.view(num, width, -1)

    def _grow_dynamic(self, requests: list[Request]) -> Forwards[tuple[torch.Tensor, list[list[int]], None]]:
        """EAGLE-2: expand the best `topk` frontier nodes per level, rerank every candidate."""
        logits, state = self._carried(requests)
        num, k = len(requests), self.topk
        scores, tokens = logits.float().log_softmax(-1).topk(k, dim=-1)  # [B, k]
        cand = dict(tokens=[tokens], scores=[scores], parents=[torch.full_like(tokens, -1)], depths=[1])
        front, front_states = torch.arange(k).expand(num, k), state[:, None].expand(num, k, -1)
        front_tokens, front_scores = tokens, scores
        masks = [np.eye(k, dtype=bool)] * num  # [B] [k, entries] each frontier node's ancestor entries and its own
        max_depth = min(self.depth, self.step_budget)  # b kept nodes are at most b deep: no deeper level can stay
        for depth in range(2, max_depth + 1):
            first = k * (depth - 2)
            logits, states = yield from self._entries(requests, front_tokens, front_states, depth - 1, first, masks)
            child_tokens, child_scores = tree.top_children(logits.float().log_softmax(-1), front_scores, k)  # [B, k, k]
            offset = sum(t.shape[1] for t in cand["tokens"])
            cand["tokens"].append(child_tokens.reshape(num, -1))
            cand["scores"].append(child_scores.reshape(num, -1))
            cand["parents"].append(front.to(tokens.device).repeat_interleave(k, dim=1))
            cand["depths"].append(depth)
            if depth == max_depth:
                break
            pick = child_scores.reshape(num, -1).topk(k, dim=-1).indices  # [B, k] among this level's k * k
            slot = pick // k  # the frontier entry each new frontier node hangs from
            front = offset + pick
            front_tokens = child_tokens.reshape(num, -1).gather(1, pick)
            front_scores = child_scores.reshape(num, -1).gather(1, pick)
            front_states = states.gather(1, slot[..., None].expand(-1, -1, states.shape[-1]))
            # the next masks: the parent entry's row, then its own entry (a host read per level)
            masks = [np.concatenate([m[s], np.eye(k, dtype=bool)], 1) for m, s in zip(masks, to_list(slot))]
        return self._rerank(cand)

    def _rerank(self, cand: dict) -> tuple[torch.Tensor, list[list[int]], None]:
        tokens, scores = torch.cat(cand["tokens"], 1), torch.cat(cand["scores"], 1)
        parents = torch.cat(cand["parents"], 1)
        depths = torch.cat([torch.full((tokens.shape[0], t.shape[1]), d, dtype=torch.int64, device=tokens.device)
                            for t, d in zip(cand["tokens"], cand["depths"])], 1)
        kept = tree.rerank(scores, depths, self.step_budget)  # [B, n]
        return tokens.gather(1, kept), to_list(tree.remap_parents(kept, parents)), None  # the kept tree's shape: a host read

    def _grow_static(self, requests: list[Request]) -> Forwards[tuple[torch.Tensor, list[list[int]], torch.Tensor | None]]:
        """Fixed shape: each node's children are its entry's best tokens (or sampled ones)."""
        parents = self.static[0][: self.step_budget]  # the first b nodes are the tree of budget b
        kids = tree_shape.children(parents)
        node_depths = tree_shape.depths(parents)
        logits, state = self._carried(requests)
        num, n = len(requests), len(parents)
        tokens = torch.full((num, n), -1, dtype=torch.int64, device=logits.device)
        probs = torch.zeros(num, n, logits.shape[-1], device=logits.device) if self.sampled else None
        self._choose_children(requests, logits[:, None], [kids[0]], tokens, probs)
        entry_of: dict[int, int] = {}  # node -> its entry index
        entry_states: list[torch.Tensor] = []  # [B, hidden] per entry
        for depth in range(1, int(node_depths.max(initial=0))):
            level = [i for i in range(n) if node_depths[i] == depth and kids[i + 1]]
            first = len(entry_of)
            entry_of.update({i: first + j for j, i in enumerate(level)})
            masks = [_static_mask(parents, level, entry_of)] * num
            src = torch.stack([state if parents[i] < 0 else entry_states[entry_of[parents[i]]] for i in level], 1)
            logits, states = yield from self._entries(requests, tokens[:, level], src, depth, first, masks)
            entry_states += list(states.unbind(1))
            self._choose_children(requests, logits, [kids[i + 1] for i in level], tokens, probs)
        return tokens, [list(parents)] * num, probs

    def _choose_children(self, requests, logits, groups: list[list[int]], tokens, probs) -> None:
        """Fill `tokens` (and `probs`) at each group's nodes from the logits [B, G, V] of their
        parent: its best tokens, or draws without replacement from its processed law."""
        for g, nodes in enumerate(groups):
            index = torch.tensor(nodes, device=tokens.device)
            if not self.sampled:
                tokens.index_copy_(1, index, logits[:, g].topk(len(nodes), dim=-1).indices)
                continue
            q = processed_probs(logits[:, g], SamplingTensors.from_params([r.params for r in requests], logits.device))
            # the engine's generator for every row: a seeded row's output never depends on its drafts
            drawn = tree.sample_without_replacement(q, len(nodes), [None] * len(requests), self.ctx.generator)
            tokens.index_copy_(1, index, drawn)
            probs.index_copy_(1, index, tree.sibling_draft_probs(q, drawn))

    # ---- after the verify forward -----------------------------------------------------------

    def launch(self, result: StepResult) -> Forwards[None]:
        """On a tree step: the head over each sequence's root and accepted path, with the
        target's states at those rows; no host reads."""
        if result.accepted_rows is None:
            yield from super().launch(result)
            return
        start = time.perf_counter()
        yield from self._launch_tree(result)
        if self.chooser is not None:
            self.chooser.record_feed(time.perf_counter() - start)

    def _launch_tree(self, result: StepResult) -> Forwards[None]:
        rows, device = result.accepted_rows, result.hidden_states.device  # [B, D + 1]
        width = rows.shape[1]
        keep = [b * width + j for b, d in enumerate(self._depths) for j in range(d + 1)]
        keep_index = torch.tensor(keep, device=device)
        offsets = torch.tensor(result.row_offsets[:-1], device=device)
        nodes = (rows[:, 1:] - offsets[:, None] - 1).clamp(min=0)  # [B, D] path nodes (junk past the accepted)
        following = torch.cat([self._tokens.gather(1, nodes.clamp(max=max(self._tokens.shape[1] - 1, 0))), torch.zeros_like(rows[:, :1])], 1)
        column = torch.arange(width, device=device)
        accepted = result.num_accepted[:, None]
        tokens = torch.where(column < accepted, following, torch.where(column == accepted, result.bonus_token_ids[:, None], 0))
        inputs = [SeqInput([0] * (d + 1), result.kv_starts[b], self.pages.table(r.request_id), logits="all")
                  for b, (r, d) in enumerate(zip(result.requests, self._depths))]
        hidden = result.hidden_states.index_select(0, rows.reshape(-1).index_select(0, keep_index))
        out = yield ForwardPlan(HEAD, inputs, input_ids=tokens.reshape(-1).index_select(0, keep_index), hidden_states=hidden)
        starts = torch.tensor(np.cumsum([0] + [d + 1 for d in self._depths[:-1]]), device=device)
        last = starts + result.num_accepted
        logits, states = out.logits.index_select(0, last), out.hidden.index_select(0, last)
        for b, r in enumerate(result.requests):
            self.carried[r.request_id], self.state[r.request_id] = logits[b], states[b]


def _static_mask(parents: list[int], level: list[int], entry_of: dict[int, int]) -> np.ndarray:
    """[len(level), entries so far] each level node's ancestor entries and its own."""
    mask = np.zeros((len(level), len(entry_of)), dtype=bool)
    for row, node in enumerate(level):
        i = node
        while i >= 0:
            if i in entry_of:
                mask[row, entry_of[i]] = True
            i = parents[i]
    return mask
