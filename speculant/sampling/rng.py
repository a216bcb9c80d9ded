"""Per-row random draws.

A row with its own generator (a request with a seed) draws only from that generator, and the
amount it draws depends only on that row, so a seeded request yields the same tokens whatever
else shares its batch. Rows without one share `default_generator` (or torch's global RNG).
Each generator must belong to a single row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Fill = Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]

# exponential_ may return exactly 0 on some backends; 0 noise would turn p / noise into inf or nan.
_MIN_EXPONENTIAL = 1e-20


def row_uniforms(
    generators: Sequence[torch.Generator | None],
    width: int,
    device: torch.device | str,
    default_generator: torch.Generator | None = None,
    counts: Sequence[int] | None = None,
) -> torch.Tensor:  # [N, width] in [0, 1)
    """Uniform draws; a row with its own generator draws `counts[row]` values (default: `width`).

    Columns past `counts[row]` are filled from the default generator; callers must not use them.
    """
    return _per_row(generators, width, device, default_generator, counts, _uniform)


def row_exponentials(
    generators: Sequence[torch.Generator | None],
    width: int,
    device: torch.device | str,
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:  # [N, width], Exp(1), strictly positive
    noise = _per_row(generators, width, device, default_generator, None, _exponential)
    return noise.clamp_(min=_MIN_EXPONENTIAL)


def sample_from_weights(
    weights: torch.Tensor,  # [N, V] non-negative, each row with positive mass; need not sum to 1
    generators: Sequence[torch.Generator | None] | None = None,
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:  # [N] int64
    """One draw per row from weights / sum(weights), by the exponential race argmax(w / E).

    Exact (no cumulative sums to round), never picks a zero-weight token, and needs no host sync.
    """
    num_rows, vocab = weights.shape
    generators = [None] * num_rows if generators is None else generators
    _check_rows(generators, num_rows)
    noise = row_exponentials(generators, vocab, weights.device, default_generator)
    return (weights.float() / noise).argmax(-1)


def _per_row(
    generators: Sequence[torch.Generator | None],
    width: int,
    device: torch.device | str,
    default_generator: torch.Generator | None,
    counts: Sequence[int] | None,
    fill: Fill,
) -> torch.Tensor:  # [N, width]
    num_rows = len(generators)
    shared_device = default_generator.device if default_generator is not None else device
    out = fill(torch.empty(num_rows, width, device=shared_device), default_generator).to(device)
    for row, generator in enumerate(generators):
        if generator is None:
            continue
        count = width if counts is None else counts[row]
        own = fill(torch.empty(count, device=generator.device), generator)
        out[row, :count] = own.to(device)
    return out


def _uniform(t: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return t.uniform_(generator=generator)


def _exponential(t: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return t.exponential_(generator=generator)


def _check_rows(generators: Sequence[torch.Generator | None], num_rows: int) -> None:
    if len(generators) != num_rows:
        raise ValueError(f"got {len(generators)} generators for {num_rows} rows")


__all__ = ["row_exponentials", "row_uniforms", "sample_from_weights"]
