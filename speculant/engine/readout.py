"""The one host read of a step: emitted tokens, their counts and logprobs, read together.

Everything a step decides stays on the device until this read: the emitted-token grid, the
accepted counts and, when a request asks, each emitted token's logprob and the top
alternatives, computed on the device for every slot of the grid. `read_lists` copies them in one
sync; the host then cuts each row to its count.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speculant.core import Request, StepOutput
from speculant.sampling.sampler import token_logprobs, top_token_logprobs
from speculant.utils.sync import read_lists


def read_step(
    tokens: torch.Tensor,  # [B, W] int64 emitted tokens, -1 padded
    counts: torch.Tensor | Sequence[int],  # [B] tokens emitted per sequence: device int64, or known to the host
    logits: torch.Tensor,  # [R, V] raw logits the emitted tokens were decided from
    rows: torch.Tensor,  # [B, W] int64 row of `logits` for each slot (any valid row past the count)
    requests: Sequence[Request],  # [B]
    extra: Sequence[torch.Tensor] = (),  # more of the step's device tensors to read along
) -> tuple[StepOutput, list[int], list[list]]:
    """The step's StepOutput, each sequence's emitted count and `extra` as lists, through one
    device-to-host read."""
    device_counts = isinstance(counts, torch.Tensor)
    reads = list(extra) + [tokens] + ([counts] if device_counts else [])
    top_n = _top_n(requests, logits.shape[-1]) if logits.shape[0] else None
    if top_n is not None:
        flat_rows = rows.reshape(-1)
        picked = logits.index_select(0, flat_rows)  # [B * W, V]
        reads.append(token_logprobs(picked, tokens.reshape(-1).clamp(min=0)).view(tokens.shape))
        if top_n:
            values, ids = top_token_logprobs(picked, top_n)  # [B * W, n]
            reads += [values.view(*tokens.shape, top_n), ids.view(*tokens.shape, top_n)]
    host = read_lists(reads)
    extras, host = host[: len(extra)], host[len(extra) :]
    grid = host[0]
    emitted_counts = host[1] if device_counts else list(counts)
    emitted = [row[:n] for row, n in zip(grid, emitted_counts)]
    logprobs = tops = None
    if top_n is not None:
        at = 2 if device_counts else 1
        logprobs = [row[:n] for row, n in zip(host[at], emitted_counts)]
        if top_n:
            tops = [[list(zip(i, v)) for i, v in zip(ids[:n], values[:n])] for ids, values, n in zip(host[at + 2], host[at + 1], emitted_counts)]
    return StepOutput(emitted, logprobs, tops), emitted_counts, extras


def _top_n(requests: Sequence[Request], vocab_size: int) -> int | None:
    """How many alternatives to report (0: only the chosen token's logprob); None: no logprobs."""
    if not any(r.params.logprobs for r in requests):
        return None
    return min(max(r.params.top_logprobs for r in requests), vocab_size)
