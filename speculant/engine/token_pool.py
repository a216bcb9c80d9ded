"""The device token pool: each running sequence's token ids in a device tensor row (its slot).

The host keeps what it needs to schedule (lengths, page tables); forward inputs are gathered from
the pool on the device, and a step's emitted tokens are scattered into it on the device before
the host reads them, so building the next forward's inputs never waits for that read. A request
is written in full once when it gets a slot (one host-to-device copy); afterwards only device
writes follow it. Slots past a sequence's length hold junk (rejected or cut tokens) that its
length never reaches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speculant.core import Request


class TokenPool:
    def __init__(self, num_slots: int, max_len: int, device: torch.device) -> None:
        self.device, self.max_len = device, max_len
        self.tokens = torch.zeros(num_slots, max_len, dtype=torch.int32, device=device)  # [slots, max_len] (int32: half the bytes)
        self._slots: dict[str, int] = {}  # request id -> row
        self._free = list(range(num_slots - 1, -1, -1))

    def admit(self, requests: Sequence[Request]) -> None:
        """Give every request without a row one, holding its tokens so far."""
        for r in requests:
            if r.request_id in self._slots:
                continue
            if not self._free:
                raise RuntimeError(f"token pool is full ({self.tokens.shape[0]} slots)")
            slot = self._slots[r.request_id] = self._free.pop()
            self.tokens[slot, : r.num_tokens] = self._on_device(r.all_token_ids).to(torch.int32)

    def release(self, request: Request) -> None:
        slot = self._slots.pop(request.request_id, None)
        if slot is not None:
            self._free.append(slot)

    def gather(self, requests: Sequence[Request], positions: Sequence[Sequence[int]]) -> torch.Tensor:
        """[sum(len(positions[b]))] int64: the tokens at `positions[b]` of each request, flat, on the device."""
        flat = [self._slots[r.request_id] * self.max_len + p for r, ps in zip(requests, positions) for p in ps]
        return self.tokens.view(-1).index_select(0, self._on_device(flat)).long()

    def write(self, requests: Sequence[Request], tokens: torch.Tensor, starts: Sequence[int]) -> None:
        """Scatter `tokens` [B, W] (device, -1 padded) to positions starts[b] + j of each row, on
        the device; positions past the pool's width are dropped."""
        width = tokens.shape[1]
        picked, index = [], []
        for b, (r, start) in enumerate(zip(requests, starts)):
            base = self._slots[r.request_id] * self.max_len
            for j in range(min(width, self.max_len - start)):
                picked.append(b * width + j)
                index.append(base + start + j)
        rows = tokens.reshape(-1).clamp(min=0).index_select(0, self._on_device(picked)).to(torch.int32)
        self.tokens.view(-1).index_copy_(0, self._on_device(index), rows)

    def _on_device(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)
