"""Training batches from hidden-state shards: sequences packed into flat batches of head entries.

A sequence t_0..t_{L-1} with target hidden states h_0..h_{L-1} (an eagle3 head's: the target's
feature layers, [3H] a token) gives L-1 head entries; entry i (RoPE position i) reads (h_i,
embedding of t_{i+1}) and learns the target's distribution at
position i+1 (what t_{i+2} should be), the alignment the MTP proposer uses at inference. With an
unrolled step s >= 2, entry i reads the head's own step s-1 output at entry i-1 instead of h_i
(the draft chain), and is trained only where that chain starts at an accepted position in the
response: i - s + 2 >= prompt_len.

The plan of which sequences form each step's global batch depends only on (seed, epoch), so every
rank, and every resumed run, computes the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqRef:
    shard: int
    start: int  # first token row in the shard
    length: int  # tokens (entries = length - 1)
    prompt_len: int


@dataclass
class Batch:
    seq_ids: torch.Tensor  # [T] int64 which sequence (of this batch) each entry belongs to
    local: torch.Tensor  # [T] int64 entry index i within its sequence (the RoPE position)
    prompt_lens: torch.Tensor  # [T] int64 the entry's sequence's prompt length
    lengths: torch.Tensor  # [T] int64 the entry's sequence's token count
    hidden_in: torch.Tensor  # [T, H] float32 h_i (eagle3: [T, 3H] the target's feature layers at i)
    embed_ids: torch.Tensor  # [T] int64 t_{i+1}
    label_ids: torch.Tensor  # [T, K] int64 the target's top-K ids at position i+1
    label_logprobs: torch.Tensor  # [T, K] float32
    hidden_next: torch.Tensor  # [T, H] float32 h_{i+1}, the regression target ([T, 0] without regression)

    @property
    def num_entries(self) -> int:
        return int(self.local.numel())

    def to(self, device: torch.device) -> Batch:
        return Batch(**{k: getattr(self, k).to(device) for k in self.__dataclass_fields__})

    def step_mask(self, step: int) -> torch.Tensor:  # [T] bool entries trained at unroll step `step`
        return (self.local >= step - 1) & (self.local - step + 2 >= self.prompt_lens)


def sequence_refs(shards: list[dict]) -> list[SeqRef]:
    refs = []
    for index, shard in enumerate(shards):
        cu, prompts = shard["cu_seqlens"].tolist(), shard["prompt_lens"].tolist()
        for b, prompt_len in enumerate(prompts):
            if cu[b + 1] - cu[b] >= 2:
                refs.append(SeqRef(index, cu[b], cu[b + 1] - cu[b], prompt_len))
    if not refs:
        raise ValueError("the hidden-state shards hold no sequence of two tokens or more")
    return refs


def trained_entries(ref: SeqRef, step: int, max_entries: int) -> int:
    """How many entries of `ref` (cut to max_entries) unroll step `step` trains (Batch.step_mask)."""
    entries = min(ref.length - 1, max_entries)
    first = max(step - 1, ref.prompt_len + step - 2)
    return max(0, entries - first)


class BatchPlan:
    """Which sequences form the global batch of each optimizer step: per epoch, a seeded
    permutation packed greedily up to `batch_tokens` entries."""

    def __init__(self, refs: list[SeqRef], batch_tokens: int, seed: int) -> None:
        self.refs, self.batch_tokens, self.seed = refs, batch_tokens, seed
        self._epochs: list[list[list[int]]] = []

    def _epoch(self, epoch: int) -> list[list[int]]:
        while len(self._epochs) <= epoch:
            order = torch.randperm(len(self.refs), generator=torch.Generator().manual_seed(self.seed + len(self._epochs)))
            self._epochs.append(self._pack(order.tolist()))
        return self._epochs[epoch]

    def _pack(self, order: list[int]) -> list[list[int]]:
        batches, current, size = [], [], 0
        for i in order:
            n = min(self.refs[i].length - 1, self.batch_tokens)
            if current and size + n > self.batch_tokens:
                batches.append(current)
                current, size = [], 0
            current.append(i)
            size += n
        return batches + [current] if current else batches

    def in_order(self) -> list[list[int]]:
        """Every sequence once, in the given order, packed as a step's batch is (evaluation)."""
        return self._pack(list(range(len(self.refs))))

    def step(self, step: int) -> list[int]:
        """Sequence indices of optimizer step `step` (0-based)."""
        epoch = 0
        while step >= len(self._epoch(epoch)):
            step -= len(self._epoch(epoch))
            epoch += 1
        return self._epoch(epoch)[step]

    def epoch_of(self, step: int) -> float:
        epoch = 0
        while step >= len(self._epoch(epoch)):
            step -= len(self._epoch(epoch))
            epoch += 1
        return epoch + step / len(self._epoch(epoch))


def build_batch(shards: list[dict], refs: list[SeqRef], indices: list[int], max_entries: int, regress: bool = True) -> Batch:
    """The flat batch of the sequences `indices` (each cut to max_entries entries); `regress=False`
    leaves out the regression targets (an eagle3 head's shards hold feature layers)."""
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in Batch.__dataclass_fields__}
    for b, i in enumerate(indices):
        ref, shard = refs[i], shards[refs[i].shard]
        n = min(ref.length - 1, max_entries)
        rows = slice(ref.start, ref.start + n)
        nxt = slice(ref.start + 1, ref.start + n + 1)
        parts["seq_ids"].append(torch.full((n,), b, dtype=torch.int64))
        parts["local"].append(torch.arange(n))
        parts["prompt_lens"].append(torch.full((n,), ref.prompt_len, dtype=torch.int64))
        parts["lengths"].append(torch.full((n,), ref.length, dtype=torch.int64))
        parts["hidden_in"].append(shard["hidden"][rows].float())
        parts["embed_ids"].append(shard["tokens"][nxt].long())
        parts["label_ids"].append(shard["topk_ids"][nxt].long())
        parts["label_logprobs"].append(shard["topk_logprobs"][nxt].float())
        parts["hidden_next"].append(shard["hidden"][nxt].float() if regress else torch.empty(n, 0))
    return Batch(**{k: torch.cat(v) for k, v in parts.items()})

