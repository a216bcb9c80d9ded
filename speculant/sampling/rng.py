"""Per-row random draws, and the position-keyed noise of seeded requests.

A row with its own generator draws only from that generator, and the amount it draws depends
only on that row. Rows without one share `default_generator` (or torch's global RNG). Each
generator must belong to a single row.

A seeded request's randomness is `PositionNoise`: the noise that decides the token at sequence
position p comes from a generator seeded with (seed, p), never from a stream consumed step by
step. So the request's tokens do not depend on its batch, on preemption, or on how many tokens
a speculative step verifies: speculation (any method, any k) leaves a seeded request's output
exactly what plain decoding gives (see `speculant.sampling.acceptance`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PositionNoise:
    """A seeded request's noise, keyed by the position of the token it decides."""

    seed: int

    def generator(self, position: int, device: torch.device | str = "cpu") -> torch.Generator:
        """A fresh generator on `device` for the token at `position` (the same every time it is
        asked). Seeding one is host bookkeeping, so an accelerator draws its noise where it is
        used: no host-to-device copy, no sync. Each device type has its own stream of draws."""
        key = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
        return torch.Generator(device=device).manual_seed(int.from_bytes(key, "little"))

    def exponentials(self, positions: Sequence[int], width: int, device: torch.device | str) -> torch.Tensor:
        """[len(positions), width] Exp(1) noise on `device`, strictly positive: row i is what a
        sampler given `generator(positions[i], device)` draws (`sample_from_weights`)."""
        rows = [_exponential(torch.empty(width, device=device), self.generator(p, device)) for p in positions]
        return torch.stack(rows).clamp_(min=_MIN_EXPONENTIAL)


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


__all__ = ["PositionNoise", "row_exponentials", "row_uniforms", "sample_from_weights"]
