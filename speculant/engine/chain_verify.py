"""Verification of draft chains: every sequence's last token and k_b drafts in one flat target
forward, acceptance on the device (`speculant.sampling.acceptance`), then the step's one read.

The verify inputs are gathered on the device (the last token from the token pool, the drafts
from the proposal), so planning the forward reads nothing; the accepted tokens are scattered into
the pool before the read. Request state is left to the engine (`Engine._apply`).
"""

from __future__ import annotations

import dataclasses

import torch

from speculant.attention.batch import SeqInput
from speculant.core import Batch, DraftProposal, Request, StepOutput, StepResult
from speculant.engine.readout import read_step
from speculant.engine.stage_parts import StageParts
from speculant.engine.token_pool import TokenPool
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.sampling.acceptance import accept_drafts, accept_greedy, pad_ragged
from speculant.sampling.sampler import SamplingTensors, argmax_tokens, processed_probs


def verify_chain(parts: StageParts, batch: Batch, proposal: DraftProposal) -> tuple[StepOutput, StepResult]:
    """The engine's verify stage for a chain proposal."""
    requests, ks = batch.requests, proposal.num_drafts
    inputs = [SeqInput([0] * (k + 1), r.num_computed_tokens, parts.pages.table(r.request_id), logits="all") for r, k in zip(requests, ks)]
    out = parts.executor.run(ForwardPlan(TARGET, inputs, input_ids=verify_ids(parts.pool, requests, proposal)))
    logits = out.logits  # [sum(k_b + 1), V] raw: the reported logprobs are the model's
    chains = [list(range(-1, k - 1)) for k in ks]  # node i under node i - 1
    decided = parts.controls.adjust(requests, chains, proposal.token_ids, logits)  # what acceptance sees
    st = parts.rows.tensors(requests)
    offsets, width = row_offsets([k + 1 for k in ks]), proposal.token_ids.shape[1] + 1
    rows = torch.tensor([[offsets[b] + min(j, k) for j in range(width)] for b, k in enumerate(ks)], device=logits.device)  # [B, k_max + 1]
    if st.all_greedy:  # no probabilities, no noise; columns past k_b repeat the last row
        result = accept_greedy(proposal.token_ids, torch.tensor(ks), argmax_tokens(decided)[rows])
    else:
        target_probs = _padded_target_probs(st, proposal, decided)
        result = accept_drafts(
            proposal.token_ids, torch.tensor(ks), proposal.draft_probs, target_probs,
            [r.noise for r in requests], [r.num_tokens for r in requests], parts.generator,
        )
    bonus = result.token_ids.gather(1, result.num_accepted[:, None])[:, 0]  # [B]
    starts = [r.num_computed_tokens for r in requests]
    step = StepResult(requests, offsets, starts, out.hidden, result.num_accepted, bonus, None, speculative=True)
    parts.pool.write(requests, result.token_ids, [r.num_tokens for r in requests])
    parts.executor.drive(parts.proposer.launch(step))  # before the host reads the step
    with parts.timeline.span("read"):
        step_out, num_emitted, _ = read_step(result.token_ids, result.num_emitted, logits, rows, requests)
    step_out.proposed = list(ks)
    return step_out, dataclasses.replace(step, accepted_counts=[n - 1 for n in num_emitted])


def verify_ids(pool: TokenPool, requests: list[Request], proposal: DraftProposal) -> torch.Tensor:
    """[sum(k_b + 1)] each sequence's last token then its drafts, gathered on the pool's device."""
    device = pool.device
    drafts = proposal.token_ids.to(device, non_blocking=True)  # [B, k_max]
    last = pool.gather(requests, [[r.num_tokens - 1] for r in requests])  # [B]
    grid = torch.cat([last[:, None], drafts], 1).reshape(-1)  # [B * (k_max + 1)]
    width = drafts.shape[1] + 1
    if all(k + 1 == width for k in proposal.num_drafts):  # no padding to drop (batch 1 always)
        return grid
    flat = [b * width + j for b, k in enumerate(proposal.num_drafts) for j in range(k + 1)]
    return grid.index_select(0, torch.tensor(flat, device=device))


def _padded_target_probs(st: SamplingTensors, proposal: DraftProposal, logits: torch.Tensor) -> torch.Tensor:
    """[B, k_max + 1, V] processed target distributions at each drafted position and the bonus."""
    counts = [k + 1 for k in proposal.num_drafts]
    probs = processed_probs(logits, st.repeat_interleave(counts))  # [sum(k_b + 1), V]
    return pad_ragged(probs, torch.tensor(counts, device=logits.device), proposal.token_ids.shape[1] + 1)


def row_offsets(num_rows: list[int]) -> list[int]:
    """[B + 1] where each sequence's rows start in a flat forward, and the total."""
    offsets = [0]
    for n in num_rows:
        offsets.append(offsets[-1] + n)
    return offsets
