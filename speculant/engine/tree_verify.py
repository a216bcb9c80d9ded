"""Verification of draft trees: every node of every sequence in one flattened target forward,
tree acceptance, and the commit of the accepted path's K/V into contiguous slots.

Sequence b verifies n_b + 1 rows: its last token (the root) at its next KV slot, then its nodes
breadth-first in the slots after it, siblings sharing a RoPE position, each row attending to the
cached prefix and its ancestors (`speculant.sampling.tree_shape.verify_mask`). After acceptance the
path's nodes (scattered among the tree's slots) are copied to the slots right after the root, so
the sequence's K/V is what a forward over its accepted tokens would have written; slots past the
new length are released at commit like rejected chain drafts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from speculant.attention.batch import SeqInput
from speculant.core import Batch, DraftProposal, Request, StepOutput, StepResult
from speculant.engine.chain_verify import verify_ids
from speculant.engine.readout import read_step
from speculant.engine.stage_parts import StageParts
from speculant.executor.executor import Executor
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.kv_cache.allocator import PageTables
from speculant.sampling.acceptance import pad_ragged
from speculant.sampling.sampler import SamplingTensors, argmax_tokens, processed_probs
from speculant.sampling.tree_acceptance import TreeAcceptResult, accept_tree, accept_tree_greedy
from speculant.sampling.tree_shape import depths, verify_mask, verify_positions


def verify_tree(parts: StageParts, batch: Batch, proposal: DraftProposal) -> tuple[StepOutput, StepResult]:
    """The engine's verify stage for a proposal carrying trees (`proposal.tree`)."""
    requests, parents = batch.requests, proposal.tree.parents
    inputs = [
        SeqInput(
            token_ids=[0] * (len(parents[b]) + 1),
            kv_start=r.num_computed_tokens,
            page_table=parts.pages.table(r.request_id),
            positions=verify_positions(parents[b], r.num_computed_tokens),
            logits="all",
            tree_mask=verify_mask(parents[b]),
        )
        for b, r in enumerate(requests)
    ]
    out = parts.executor.run(ForwardPlan(TARGET, inputs, input_ids=verify_ids(parts.pool, requests, proposal)))
    counts = [len(p) + 1 for p in parents]
    decided = parts.controls.adjust(requests, parents, proposal.token_ids, out.logits)  # raw logits give the logprobs
    result = _accept(parts.rows.tensors(requests), requests, proposal, decided, counts, parts.generator)
    offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
    rows = _accepted_rows(result, offsets)
    _compact(parts.executor, parts.pages, requests, parents, result)
    bonus = result.token_ids.gather(1, result.num_accepted[:, None])[:, 0]
    starts = [r.num_computed_tokens for r in requests]
    step = StepResult(requests, offsets, starts, out.hidden, result.num_accepted, bonus, None, speculative=True, accepted_rows=rows)
    parts.pool.write(requests, result.token_ids, [r.num_tokens for r in requests])
    parts.executor.drive(parts.proposer.launch(step))  # before the host reads the step
    with parts.timeline.span("read"):
        step_out, num_emitted, (paths,) = read_step(result.token_ids, result.num_accepted + 1, out.logits, rows, requests, [result.path])
    step_out.proposed = [int(depths(p).max()) if p else 0 for p in parents]  # acceptance by position counts tree levels
    accepted = [n - 1 for n in num_emitted]
    paths = [path[:a] for path, a in zip(paths, accepted)]
    return step_out, dataclasses.replace(step, accepted_counts=accepted, accepted_paths=paths)


def _accept(
    st: SamplingTensors, requests: list[Request], proposal: DraftProposal, logits: torch.Tensor, counts: list[int], generator: torch.Generator,
) -> TreeAcceptResult:
    """Greedy batches compare argmaxes; others walk the trees with the processed target laws."""
    width = proposal.token_ids.shape[1] + 1
    count_tensor = torch.tensor(counts, device=logits.device)
    if st.all_greedy:
        argmax = pad_ragged(argmax_tokens(logits)[:, None], count_tensor, width)[..., 0]  # [B, n + 1]
        return accept_tree_greedy(proposal.token_ids, proposal.tree.parents, argmax)
    probs = pad_ragged(processed_probs(logits, st.repeat_interleave(counts)), count_tensor, width)
    noise, positions = [r.noise for r in requests], [r.num_tokens for r in requests]
    return accept_tree(proposal.token_ids, proposal.tree.parents, proposal.draft_probs, probs, noise, positions, generator)


def _accepted_rows(result: TreeAcceptResult, offsets: list[int]) -> torch.Tensor:  # [B, D + 1]
    """Flat forward rows of each root and accepted path; the root's row past the path."""
    device = result.path.device
    starts = torch.tensor(offsets[:-1], device=device)
    path_rows = torch.where(result.path >= 0, result.path + 1, 0)
    return starts[:, None] + torch.cat([torch.zeros_like(starts[:, None]), path_rows], 1)


def _compact(executor: Executor, pages: PageTables, requests: list[Request], parents: list[list[int]], result: TreeAcceptResult) -> None:
    """Copy the target's K/V of each accepted node at depth j + 1 to the slot right after the
    root's + j (nodes past the path copy onto themselves); all on the device."""
    page_size, width = executor.page_size, result.path.shape[1]
    num_nodes = max(len(p) for p in parents)
    node_slots, dst_slots, keep = [], [], []
    for b, r in enumerate(requests):
        table, root = pages.table(r.request_id), r.num_computed_tokens
        n = len(parents[b])
        node_slots.append([_slot(table, root + 1 + i, page_size) for i in range(n)] + [0] * (num_nodes - n))
        dst_slots.append([_slot(table, root + 1 + j, page_size) for j in range(min(width, n))] + [0] * (width - min(width, n)))
        keep += [b * width + j for j in range(min(width, n))]
    if not keep:
        return
    device = result.path.device
    nodes, dst = torch.tensor(node_slots, device=device), torch.tensor(dst_slots, device=device)
    src = torch.where(result.path >= 0, nodes.gather(1, result.path.clamp(min=0)), dst)
    index = torch.tensor(keep, device=device)
    executor.move_kv(TARGET, src.reshape(-1).index_select(0, index), dst.reshape(-1).index_select(0, index))


def _slot(page_table: list[int], position: int, page_size: int) -> int:
    return page_table[position // page_size] * page_size + position % page_size
