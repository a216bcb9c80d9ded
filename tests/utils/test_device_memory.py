"""The free-memory probe a fractional memory budget reads."""

from __future__ import annotations

import torch

from speculant.utils.device_memory import free_device_bytes


def test_cpu_free_memory_is_memavailable_in_bytes():
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    assert 0 < free_device_bytes(torch.device("cpu")) <= total_kib * 1024
