"""The inputs of a head run over a target forward's rows (`speculant.speculative.mtp`): row i of
a sequence reads the token after it, t_{i+1}, which on the forward's last rows is the step's own
output, still on the device."""

from __future__ import annotations

import torch

from speculant.core import StepResult


def chunk_inputs(result: StepResult) -> torch.Tensor:
    """[T] each row's next token: the request's own, or the step's sample after its last."""
    host, sampled_rows, sampled_seqs = [], [], []
    for b, r in enumerate(result.requests):
        start, n = result.kv_starts[b], result.row_offsets[b + 1] - result.row_offsets[b]
        end = start + n  # the token after the chunk: a prompt token, or this step's sample
        host += r.token_slice(start + 1, min(end + 1, r.num_tokens))
        if end >= r.num_tokens:
            sampled_rows.append(len(host))
            sampled_seqs.append(b)
            host.append(0)
    device = result.hidden_states.device
    tokens = torch.tensor(host, dtype=torch.int64).to(device, non_blocking=True)
    if sampled_rows:
        picked = result.bonus_token_ids.index_select(0, torch.tensor(sampled_seqs, device=device))
        tokens.index_copy_(0, torch.tensor(sampled_rows, device=device), picked.clamp(min=0))
    return tokens


def verified_inputs(drafts: torch.Tensor, result: StepResult) -> torch.Tensor:  # drafts [B, k_max] -> [T]
    """[T] row j of sequence b: draft j+1 while accepted, the bonus token from the first
    rejected slot on (junk there, overwritten next step)."""
    b_count, k_max = drafts.shape
    slot = torch.arange(k_max + 1, device=drafts.device)  # [k_max + 1]
    padded = torch.cat([drafts.clamp(min=0), torch.zeros(b_count, 1, dtype=drafts.dtype, device=drafts.device)], 1)
    grid = torch.where(slot < result.num_accepted[:, None], padded, result.bonus_token_ids[:, None])
    flat = [b * (k_max + 1) + j for b in range(b_count) for j in range(result.row_offsets[b + 1] - result.row_offsets[b])]
    return grid.reshape(-1).index_select(0, torch.tensor(flat, device=drafts.device))
