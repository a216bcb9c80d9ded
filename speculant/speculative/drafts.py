"""Helpers the proposers share to make drafts: a draft token from a draft distribution (seeded
requests draw the noise of the position drafted for), the work a draft chain costs adaptive k,
and a one-hot `DraftProposal` from host token lists."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from speculant.core import DraftProposal, Request
from speculant.sampling.sampler import SamplingTensors, argmax_tokens, processed_probs, sample


def choose_drafts(
    logits: torch.Tensor,  # [N, V] a draft model's or head's logits for the next token
    requests: list[Request],  # [N]
    sampled: bool,  # draw from the processed distribution (else the argmax, a one-hot q)
    default_generator: torch.Generator,
    offset: int = 0,  # the drafts decide the tokens at position num_tokens + offset
) -> tuple[torch.Tensor, torch.Tensor | None]:  # tokens [N] int64, q [N, V] (None when greedy)
    """A seeded request's draft uses the noise of the position it proposes for, the noise its
    verification samples the target with: the draft is accepted whenever both agree."""
    if not sampled:
        return argmax_tokens(logits), None
    st = SamplingTensors.from_params([r.params for r in requests], logits.device)
    q = processed_probs(logits, st)
    generators = [r.noise.generator(r.num_tokens + offset, logits.device) if r.noise else None for r in requests]
    return sample(q, generators, default_generator), q


def chain_work(ks: Sequence[int]) -> tuple[int, int]:
    """(forwards, rows) of drafting chains of these k's when the first draft comes from carried
    logits: forward j (1 <= j < max k) carries every request with k > j."""
    return max(0, max(ks, default=0) - 1), sum(ks) - len(ks) + ks.count(0)


def pad_proposals(drafts: list[list[int]], device: torch.device | str = "cpu") -> DraftProposal:
    """A one-hot DraftProposal on `device` from per-sequence token lists (one host-to-device copy)."""
    k_max = max((len(d) for d in drafts), default=0)
    tokens = np.full((len(drafts), k_max), -1, dtype=np.int64)
    for b, d in enumerate(drafts):
        tokens[b, : len(d)] = d
    token_ids = torch.from_numpy(tokens).to(device, non_blocking=True)
    return DraftProposal(token_ids=token_ids, num_drafts=[len(d) for d in drafts])
