"""The leader's one message per operation: a byte buffer broadcast from rank 0 to every rank.

A message is a header of `HEADER` int64 values (the op code, then the op's integers: sizes,
indices) followed by segments, each starting at a multiple of 8 bytes: a forward's packed
`ForwardBatch` (int64), its device token ids (int64), input embeddings and hidden states
(the model's dtype), or a pickled object. Device tensors are copied into the buffer on the
device (no host read); a worker reads the header and the batch description on its host.

Every rank keeps a buffer of the same capacity (a broadcast moves equal sizes); a message that
does not fit is preceded by a GROW message carrying the new capacity.
"""

from __future__ import annotations

import enum
import pickle

import numpy as np
import torch

from speculant.distributed.group import TPGroup

HEADER = 9  # int64 values: the op, then up to 8 ints
_ALIGN = 8
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)


class Op(enum.IntEnum):
    GROW = 1  # (capacity)
    RUN = 2  # (model index, T, embeds cols, hidden cols, dtype code, has ids) + batch, ids, embeds, hidden
    MOVE_KV = 3  # (model index, M) + src, dst
    ALLOCATE = 4  # (num_pages, page_size)
    ADD_MODEL = 5  # (nbytes) + pickled (name, head_of, ModelConfig, head checkpoint)
    STOP = 6


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype)


def code_dtype(code: int) -> torch.dtype:
    return _DTYPES[code]


class Channel:
    """Rank 0 sends messages, the others receive them, through one broadcast each."""

    def __init__(self, group: TPGroup, capacity: int = 1 << 16) -> None:
        self.group, self.capacity = group, capacity
        self.buf = torch.zeros(capacity, dtype=torch.uint8, device=group.device)

    def send(self, op: Op, ints: list[int], segments: list[torch.Tensor]) -> None:
        """Broadcast `op` with up to HEADER - 1 integers and the segments' bytes, in order."""
        parts = [torch.tensor([int(op), *ints] + [0] * (HEADER - 1 - len(ints)), dtype=torch.int64)] + segments
        size = sum(_padded(p) for p in parts)
        if size > self.capacity:
            self.send(Op.GROW, [max(size, 2 * self.capacity)], [])
        offset = 0
        for part in parts:
            n = part.numel() * part.element_size()
            self.buf[offset : offset + n].copy_(part.contiguous().reshape(-1).view(torch.uint8), non_blocking=True)
            offset += _padded(part)
        self.group.broadcast(self.buf)
        if op == Op.GROW:
            self._resize(ints[0])

    def receive(self) -> Message:
        """The next message (GROW is handled here and never returned)."""
        while True:
            self.group.broadcast(self.buf)
            message = Message(self.buf)
            if message.op != Op.GROW:
                return message
            self._resize(message.ints[0])

    def _resize(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf = torch.zeros(capacity, dtype=torch.uint8, device=self.group.device)


class Message:
    """A received buffer: `op`, `ints`, and segments read in the order they were sent."""

    def __init__(self, buf: torch.Tensor) -> None:
        header = buf[: HEADER * 8].view(torch.int64).cpu().tolist()
        self.op, self.ints = Op(header[0]), header[1:]
        self.buf, self.offset = buf, HEADER * 8

    def segment(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """The next `count` values of `dtype`: a view into the buffer (valid until the next receive)."""
        n = count * dtype.itemsize
        out = self.buf[self.offset : self.offset + n].view(dtype)
        self.offset += -(-n // _ALIGN) * _ALIGN
        return out

    def host_int64(self, count: int) -> np.ndarray:
        return self.segment(count, torch.int64).cpu().numpy()

    def object(self, nbytes: int):
        return pickle.loads(self.segment(nbytes, torch.uint8).cpu().numpy().tobytes())


def object_segment(obj) -> tuple[int, torch.Tensor]:
    data = pickle.dumps(obj)
    return len(data), torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _padded(t: torch.Tensor) -> int:
    return -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
