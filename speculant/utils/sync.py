"""Every device-to-host read goes through here, so syncs can be counted (and later removed)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_local = threading.local()


def host_reads() -> int:
    """Device-to-host reads of accelerator tensors made by this thread so far."""
    return getattr(_local, "count", 0)


@contextlib.contextmanager
def counting_cpu_reads() -> Iterator[None]:
    """Count reads of CPU tensors too (tests: the reads a step would make on an accelerator)."""
    before = getattr(_local, "cpu", False)
    _local.cpu = True
    try:
        yield
    finally:
        _local.cpu = before


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU; counts a sync when `t` lives on an accelerator."""
    if t.device.type != "cpu" or getattr(_local, "cpu", False):
        _local.count = host_reads() + 1
        return t.cpu()
    return t


def to_list(t: torch.Tensor) -> list:
    return to_host(t).tolist()
