"""Every device-to-host read goes through here, so syncs can be counted (and later removed)."""

from __future__ import annotations

import threading

import torch

_local = threading.local()


def host_reads() -> int:
    """Device-to-host reads of accelerator tensors made by this thread so far."""
    return getattr(_local, "count", 0)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU; counts a sync when `t` lives on an accelerator."""
    if t.device.type != "cpu":
        _local.count = host_reads() + 1
        return t.cpu()
    return t


def to_list(t: torch.Tensor) -> list:
    return to_host(t).tolist()
