"""From logits to the distribution a request samples from, and from there to tokens.

Pure functions over a batch whose rows may each carry different sampling parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from speculant.kernels import native
from speculant.sampling.params import GREEDY_BELOW, SamplingParams
from speculant.sampling.rng import sample_from_weights


def argmax_tokens(logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...] int64
    """Each row's greedy token: the index `torch.argmax` gives (the first maximum, a NaN above
    all), from the native AVX2 kernel on CPU float32 logits (ATen's reduction takes ~50-100 us
    a 49,152-token row here, the kernel ~8: ~1% of a small model's step), else from torch."""
    cpu_f32 = logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() > 0 and logits.shape[-1] > 0
    kernels = native.module() if cpu_f32 and native.use_avx2() else None
    if kernels is None:
        return logits.argmax(dim=-1)
    rows = logits.reshape(-1, logits.shape[-1]).contiguous()  # [N, V]
    return kernels.argmax_rows(rows, True).view(logits.shape[:-1])


@dataclass
class SamplingTensors:
    """Per-row sampling parameters. The bool flags let `processed_probs` skip unused stages
    without a device sync; True is always safe (just slower)."""

    temperature: torch.Tensor  # [N] float32; ignored where greedy
    top_k: torch.Tensor  # [N] int64, 0 disables
    top_p: torch.Tensor  # [N] float32 in (0, 1], 1 disables
    min_p: torch.Tensor  # [N] float32 in [0, 1], 0 disables
    greedy: torch.Tensor  # [N] bool
    needs_sort: bool = True  # some row uses top-k or top-p
    needs_min_p: bool = True  # some row uses min-p
    any_greedy: bool = True  # some row is greedy
    all_greedy: bool = False  # every row is greedy

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu"
    ) -> SamplingTensors:
        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(device)

        sampled = [p for p in params if not p.greedy]
        return cls(
            temperature=column([p.temperature for p in params], torch.float32),
            top_k=column([p.top_k for p in params], torch.int64),
            top_p=column([p.top_p for p in params], torch.float32),
            min_p=column([p.min_p for p in params], torch.float32),
            greedy=column([p.greedy for p in params], torch.bool),
            needs_sort=any(p.top_k > 0 or p.top_p < 1.0 for p in sampled),
            needs_min_p=any(p.min_p > 0.0 for p in sampled),
            any_greedy=len(sampled) < len(params),
            all_greedy=not sampled,
        )

    @classmethod
    def cat(cls, rows: Sequence[SamplingTensors]) -> SamplingTensors:
        """The rows of several tensors sets, in order (e.g. one set per request)."""
        return cls(
            temperature=torch.cat([r.temperature for r in rows]),
            top_k=torch.cat([r.top_k for r in rows]),
            top_p=torch.cat([r.top_p for r in rows]),
            min_p=torch.cat([r.min_p for r in rows]),
            greedy=torch.cat([r.greedy for r in rows]),
            needs_sort=any(r.needs_sort for r in rows),
            needs_min_p=any(r.needs_min_p for r in rows),
            any_greedy=any(r.any_greedy for r in rows),
            all_greedy=all(r.all_greedy for r in rows),
        )

    def repeat_interleave(self, counts: torch.Tensor | Sequence[int]) -> SamplingTensors:
        """Row b repeated counts[b] times, e.g. once per verified position (k_b + 1). Host counts
        give the output size up front: device counts would make the device report it (a sync)."""
        total = None if isinstance(counts, torch.Tensor) else sum(counts)
        counts = torch.as_tensor(counts, dtype=torch.int64).to(self.temperature.device, non_blocking=True)

        def repeat(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(counts, output_size=total)

        return SamplingTensors(
            temperature=repeat(self.temperature),
            top_k=repeat(self.top_k),
            top_p=repeat(self.top_p),
            min_p=repeat(self.min_p),
            greedy=repeat(self.greedy),
            needs_sort=self.needs_sort,
            needs_min_p=self.needs_min_p,
            any_greedy=self.any_greedy,
            all_greedy=self.all_greedy,
        )

    def __len__(self) -> int:
        return self.temperature.shape[0]


def processed_probs(
    logits: torch.Tensor,  # [N, V]
    st: SamplingTensors,  # N rows
) -> torch.Tensor:  # [N, V] float32, rows sum to 1
    """Temperature, then top-k, then top-p, then min-p, renormalized; greedy rows are one-hot.

    Top-k keeps exactly k tokens and top-p the smallest prefix of the descending order whose mass
    reaches top_p (always the top token); ties in that order go to the lower token id. Top-p is
    measured on the top-k distribution. Min-p drops tokens with p < min_p * max(p). Whatever the
    parameters, the top token survives every cut-off, and a temperature below GREEDY_BELOW is
    raised to it (dividing by less overflows float32), so every row is a distribution.
    """
    logits = logits.float()
    temperature = torch.where(st.greedy, 1.0, st.temperature.clamp(min=GREEDY_BELOW))
    scaled = logits / temperature[:, None]
    if st.needs_sort:
        scaled = _mask_top_k_top_p(scaled, st.top_k, st.top_p)
    probs = scaled.softmax(-1)
    if st.needs_min_p:
        probs = _apply_min_p(probs, st.min_p)
    if st.any_greedy:
        probs = torch.where(st.greedy[:, None], _one_hot_argmax(logits), probs)
    return probs


def sample(
    probs: torch.Tensor,  # [N, V]
    generators: Sequence[torch.Generator | None] | None = None,  # [N]; None: all rows default
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:  # [N] int64
    """One token per row. One-hot rows (greedy) return their token whatever the noise."""
    return sample_from_weights(probs, generators, default_generator)


def sample_logits(
    logits: torch.Tensor,  # [N, V] raw
    st: SamplingTensors,
    generators: Sequence[torch.Generator | None] | None = None,  # [N]
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:  # [N] int64
    """`sample(processed_probs(logits, st), ...)`, with an all-greedy batch taking the argmax
    directly (no V-wide noise, no probabilities: the common decode case)."""
    if st.all_greedy:
        return argmax_tokens(logits)
    return sample(processed_probs(logits, st), generators, default_generator)


LSE_CHUNK = 4096  # logsumexp sums each row in chunks this long (`row_log_normalizer`)


def token_logprobs(
    logits: torch.Tensor,  # [N, V] raw, before temperature and truncation
    token_ids: torch.Tensor,  # [N] int64
) -> torch.Tensor:  # [N] float32
    """log softmax(logits)[token]: the logprob reported for each emitted token (OpenAI style)."""
    logits = logits.float()
    chosen = logits.gather(-1, token_ids[:, None].long())  # [N, 1]
    top, log_sum = row_log_normalizer(logits)
    return ((chosen - top) - log_sum).squeeze(-1)


def top_token_logprobs(
    logits: torch.Tensor,  # [N, V] raw
    n: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([N, n] float32 logprobs, [N, n] int64 token ids)
    """The n most likely tokens of each row under log softmax(logits), most likely first."""
    logits = logits.float()
    values, ids = logits.topk(n, dim=-1)
    top, log_sum = row_log_normalizer(logits)
    return (values - top) - log_sum, ids


def row_log_normalizer(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [N, V] -> ([N, 1], [N, 1])
    """(max, log sum exp(logits - max)) of each row, so log softmax = (logits - max) - log_sum,
    bit for bit the same whatever the other rows: torch splits a lone row's sum over threads, so
    a row's logprob differed by an ulp between a one-row decode step and a verify step. Rows are
    padded to whole chunks, each chunk summed by one thread, then a row's chunk sums in order."""
    n, v = logits.shape
    chunks = -(-v // LSE_CHUNK)
    top = logits.amax(-1, keepdim=True)  # [N, 1] exact in any order
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    shifted = torch.nn.functional.pad(logits - top, (0, chunks * LSE_CHUNK - v), value=-torch.inf)
    partial = shifted.exp().view(n * chunks, LSE_CHUNK).sum(-1)  # [N * chunks]
    return top, partial.view(n, chunks).sum(-1, keepdim=True).log()


def _mask_top_k_top_p(
    scaled: torch.Tensor,  # [N, V]
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] float32
) -> torch.Tensor:  # [N, V], dropped tokens at -inf
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=scaled.device)
    k = torch.where(top_k > 0, top_k, vocab)
    drop_sorted = rank[None, :] >= k[:, None]
    sorted_probs = sorted_logits.masked_fill(drop_sorted, float("-inf")).softmax(-1)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    # Rows at top_p == 1 skip the test: float cumsums can pass 1 before the tail.
    drop_sorted |= (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop_sorted[:, 0] = False  # the top token stays, even for a top_p that rounds to 0
    drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))


def _apply_min_p(
    probs: torch.Tensor,  # [N, V]
    min_p: torch.Tensor,  # [N]
) -> torch.Tensor:  # [N, V]
    top = probs.amax(-1, keepdim=True)
    kept = probs.masked_fill((probs < min_p[:, None] * top) & (probs < top), 0.0)
    return kept / kept.sum(-1, keepdim=True)


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N, V] float32
    one_hot = torch.zeros_like(logits, dtype=torch.float32)
    return one_hot.scatter_(-1, argmax_tokens(logits)[..., None], 1.0)


__all__ = ["SamplingTensors", "processed_probs", "sample", "token_logprobs", "top_token_logprobs"]
