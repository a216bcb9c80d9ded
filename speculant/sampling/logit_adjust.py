"""What a request's own rules do to the target's logits before sampling or verification: the
grammar's mask, banned stop tokens (min_tokens), logit_bias and the repetition, frequency and
presence penalties.

Pure functions of (logits, the adjustments of each row). Under speculation each verified row is
adjusted as plain decoding would adjust the logits at its position: its grammar state, output
length and token counts include the drafts on its path. Building those rows is the engine's
(`speculant.engine.logit_rows`); here they are inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LogitAdjustments:
    """Per-row adjustments of a [R, V] logits tensor; None: that stage is off for every row."""

    allowed: torch.Tensor | None = None  # [R, W] int32 packed grammar masks: bit t % 32 of word t // 32 allows token t (W * 32 >= V)
    banned: torch.Tensor | None = None  # [R, V] bool tokens banned at the row (stop tokens before min_tokens)
    bias: torch.Tensor | None = None  # [R, V] float32 added to the logits (logit_bias)
    output_counts: torch.Tensor | None = None  # [R, V] float32 each token's count in the output before the row
    frequency: torch.Tensor | None = None  # [R] float32 with output_counts
    presence: torch.Tensor | None = None  # [R] float32 with output_counts
    seen: torch.Tensor | None = None  # [R, V] bool tokens in the prompt or the output before the row
    repetition: torch.Tensor | None = None  # [R] float32 with seen; 1 leaves a row alone


def adjust_logits(
    logits: torch.Tensor,  # [R, V]
    adj: LogitAdjustments,
) -> torch.Tensor:  # [R, V] float32, a new tensor
    """Repetition penalty (CTRL, Keskar et al. 2019: positive logits divided, negative multiplied),
    then frequency and presence penalties (OpenAI), then logit_bias, then the grammar mask and the
    bans, as -inf. A ban that would leave a row nothing its grammar allows is lifted (the grammar
    wins: it can only end there); a row whose grammar allows nothing in the model's vocabulary
    keeps its logits. Neutral values (penalty 1 or 0, bias 0) leave a row's bits unchanged."""
    out = logits.float().clone()
    if adj.seen is not None:
        r = adj.repetition[:, None]
        out = torch.where(adj.seen, torch.where(out > 0, out / r, out * r), out)
    if adj.output_counts is not None:
        counts = adj.output_counts
        out = out - adj.frequency[:, None] * counts - adj.presence[:, None] * (counts > 0).float()
    if adj.bias is not None:
        out = out + adj.bias
    keep = None if adj.allowed is None else unpack_bitmask(adj.allowed, out.shape[-1])
    if keep is not None:
        keep = keep | ~keep.any(-1, keepdim=True)
    if adj.banned is not None:
        base = keep if keep is not None else torch.ones_like(adj.banned)
        unbanned = base & ~adj.banned
        keep = torch.where(unbanned.any(-1, keepdim=True), unbanned, base)
    return out if keep is None else out.masked_fill(~keep, float("-inf"))


def unpack_bitmask(
    packed: torch.Tensor,  # [R, W] int32
    vocab_size: int,  # V <= 32 * W
) -> torch.Tensor:  # [R, V] bool
    ids = torch.arange(vocab_size, device=packed.device)
    words = packed.index_select(1, ids // 32)  # [R, V]
    return ((words >> (ids % 32).to(torch.int32)) & 1).bool()


__all__ = ["LogitAdjustments", "adjust_logits", "unpack_bitmask"]
