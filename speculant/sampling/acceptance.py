"""Speculative-sampling verification: which drafts the target accepts, and the token after them.

Follows Leviathan et al. 2023 (Alg. 1) and Chen et al. 2023: draft d_i ~ q_i is accepted with
probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the *recovered* token is drawn
from normalize(max(0, p_i - q_i)); if all k drafts pass, the *bonus* token is drawn from p_k.
The emitted tokens are then distributed exactly as if sampled from the target one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.sampling.rng import PositionNoise, row_uniforms, sample_from_weights


@dataclass
class AcceptResult:
    # Accepted drafts, then the recovered or bonus token; -1 padded.
    token_ids: torch.Tensor  # [B, k_max + 1] int64
    num_emitted: torch.Tensor  # [B] int64, num_accepted + 1
    num_accepted: torch.Tensor  # [B] int64, drafts accepted (0..num_draft[b])

    def tolist(self) -> list[list[int]]:
        """[B][num_emitted[b]] emitted token ids."""
        rows = self.token_ids.tolist()
        return [row[:n] for row, n in zip(rows, self.num_emitted.tolist(), strict=True)]


def accept_drafts(
    draft_token_ids: torch.Tensor,  # [B, k_max] int64, -1 past num_draft[b]
    num_draft: torch.Tensor,  # [B] int64, k_b
    draft_probs: torch.Tensor | None,  # [B, k_max, V] q_i; None: q_i one-hot at the draft
    target_probs: torch.Tensor,  # [B, k_max + 1, V] processed p_i; rows past k_b are padding
    noise: Sequence[PositionNoise | None] | None = None,  # [B] seeded rows' noise; None: unseeded
    positions: Sequence[int] | None = None,  # [B] sequence position of each row's first draft
    default_generator: torch.Generator | None = None,
) -> AcceptResult:
    """Verify a batch of draft chains; exact for any draft distribution (one-hot included).

    Unseeded rows follow the rule above with the default generator. A seeded row (its
    `PositionNoise`) instead emits the target's own sample at each position, the exponential
    race argmax(p_i / E_i) with the noise E_i keyed to that position, and accepts a draft iff it
    equals that sample: exactly the tokens plain decoding draws for the request, whatever the
    drafts; a one-hot draft is accepted with probability p(d), as under the rule above.
    A drafted token with q(d) = 0 (inconsistent input) is accepted iff p(d) > 0.
    """
    num_rows = draft_token_ids.shape[0]
    num_draft = num_draft.to(draft_token_ids.device, torch.int64)
    num_accepted = _count_accepted(draft_token_ids, num_draft, draft_probs, target_probs, default_generator)
    weights = _final_weights(draft_token_ids, num_draft, draft_probs, target_probs, num_accepted)
    final = sample_from_weights(weights, None, default_generator)
    keyed = [b for b in range(num_rows) if noise is not None and noise[b] is not None]
    if keyed:
        own_accepted, own_final = _keyed_samples(draft_token_ids, num_draft, target_probs, noise, positions, keyed)
        rows = torch.tensor(keyed, device=draft_token_ids.device)
        num_accepted = num_accepted.index_copy(0, rows, own_accepted)
        final = final.index_copy(0, rows, own_final)
    token_ids = _emitted_tokens(draft_token_ids, num_accepted, final)
    return AcceptResult(token_ids=token_ids, num_emitted=num_accepted + 1, num_accepted=num_accepted)


def accept_greedy(
    draft_token_ids: torch.Tensor,  # [B, k_max] int64, -1 past num_draft[b]
    num_draft: torch.Tensor,  # [B] int64, k_b
    target_argmax: torch.Tensor,  # [B, k_max + 1] int64, the target's argmax at each position
) -> AcceptResult:
    """`accept_drafts` for a batch whose every row is greedy (one-hot p): a draft is accepted iff
    it is the target's argmax, whatever its q, and the token after the accepted ones is the
    argmax there. No probabilities and no noise (the common greedy decode case). Every emitted
    token is the argmax at its position (an accepted draft equals it), so `target_argmax` only
    has to be right up to column num_draft[b] of each row; the rest may be anything."""
    k_max, device = draft_token_ids.shape[1], draft_token_ids.device
    pos = torch.arange(k_max + 1, device=device)  # [k_max + 1]
    num_draft = num_draft.to(device, torch.int64)
    match = (draft_token_ids == target_argmax[:, :k_max]) & (pos[:k_max] < num_draft[:, None])  # [B, k_max]
    num_accepted = match.long().cumprod(-1).sum(-1)  # [B]
    token_ids = target_argmax.masked_fill(pos > num_accepted[:, None], -1)  # [B, k_max + 1]
    return AcceptResult(token_ids=token_ids, num_emitted=num_accepted + 1, num_accepted=num_accepted)


def _keyed_samples(draft_token_ids, num_draft, target_probs, noise, positions, keyed: list[int]):
    """(num_accepted [R], final [R]) of the seeded rows `keyed`: the target's keyed samples
    t_i = argmax(p_i / E_i), drafts accepted while they equal them, then t at the first miss."""
    width, vocab = target_probs.shape[1], target_probs.shape[2]
    device = target_probs.device
    e = torch.stack([noise[b].exponentials(range(positions[b], positions[b] + width), vocab, device) for b in keyed])
    index = torch.tensor(keyed, device=device)
    samples = (target_probs.index_select(0, index).float() / e).argmax(-1)  # [R, k_max + 1]
    k_max = draft_token_ids.shape[1]
    valid = torch.arange(k_max, device=device)[None, :] < num_draft.index_select(0, index)[:, None]
    match = (draft_token_ids.index_select(0, index) == samples[:, :k_max]) & valid
    accepted = match.long().cumprod(-1).sum(-1)
    return accepted, samples.gather(1, accepted[:, None])[:, 0]


def pad_ragged(
    flat: torch.Tensor,  # [sum(counts), ...] rows of B sequences, back to back
    counts: torch.Tensor,  # [B] int64, >= 1
    width: int,  # >= max(counts)
) -> torch.Tensor:  # [B, width, ...], zero past counts[b]
    """Flat per-position rows (e.g. target probs of k_b + 1 positions) into a padded batch."""
    counts = counts.to(flat.device, torch.int64)
    starts = counts.cumsum(0) - counts
    pos = torch.arange(width, device=flat.device)
    index = (starts[:, None] + pos).clamp(max=flat.shape[0] - 1)  # [B, width]
    valid = pos[None, :] < counts[:, None]
    out = flat[index]
    return out.masked_fill(~valid.view(*valid.shape, *[1] * (out.dim() - 2)), 0)


def _count_accepted(
    draft_token_ids: torch.Tensor,  # [B, k_max]
    num_draft: torch.Tensor,  # [B]
    draft_probs: torch.Tensor | None,  # [B, k_max, V]
    target_probs: torch.Tensor,  # [B, k_max + 1, V]
    default_generator: torch.Generator | None,
) -> torch.Tensor:  # [B] int64, length of the accepted prefix
    k_max = draft_token_ids.shape[1]
    drafts = draft_token_ids.clamp(min=0)[..., None]  # [B, k_max, 1]
    p = target_probs[:, :k_max].float().gather(-1, drafts).squeeze(-1)  # [B, k_max]
    q = (
        torch.ones_like(p)
        if draft_probs is None
        else draft_probs.float().gather(-1, drafts).squeeze(-1)
    )
    u = row_uniforms([None] * len(p), k_max, p.device, default_generator)  # [B, k_max]
    valid = torch.arange(k_max, device=p.device)[None, :] < num_draft[:, None]
    # u < p / q without dividing: P(accept) = min(1, p / q) for u ~ U[0, 1).
    accepted = (u * q < p) & valid
    return accepted.long().cumprod(-1).sum(-1)


def _final_weights(
    draft_token_ids: torch.Tensor,  # [B, k_max]
    num_draft: torch.Tensor,  # [B]
    draft_probs: torch.Tensor | None,  # [B, k_max, V]
    target_probs: torch.Tensor,  # [B, k_max + 1, V]
    num_accepted: torch.Tensor,  # [B]
) -> torch.Tensor:  # [B, V] unnormalized distribution of the recovered or bonus token
    rows = torch.arange(draft_token_ids.shape[0], device=draft_token_ids.device)
    p = target_probs[rows, num_accepted].float()  # [B, V]
    k_max = draft_token_ids.shape[1]
    if k_max == 0:
        return p
    at = num_accepted.clamp(max=k_max - 1)
    if draft_probs is None:
        q = F.one_hot(draft_token_ids[rows, at].clamp(min=0), p.shape[-1]).float()
    else:
        q = draft_probs[rows, at].float()
    residual = (p - q).clamp(min=0)
    # p <= q everywhere can only come from rounding; p is then the right distribution.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
    rejected = num_accepted < num_draft
    return torch.where(rejected[:, None], residual, p)


def _emitted_tokens(
    draft_token_ids: torch.Tensor,  # [B, k_max]
    num_accepted: torch.Tensor,  # [B]
    final: torch.Tensor,  # [B] recovered or bonus token
) -> torch.Tensor:  # [B, k_max + 1]
    padded = F.pad(draft_token_ids, (0, 1), value=-1)
    pos = torch.arange(padded.shape[1], device=padded.device)
    out = torch.where(pos[None, :] < num_accepted[:, None], padded, torch.full_like(padded, -1))
    return out.scatter_(1, num_accepted[:, None], final[:, None])


__all__ = ["AcceptResult", "accept_drafts", "pad_ragged"]
