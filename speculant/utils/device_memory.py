"""How much memory a device has free now: the one probe a memory budget given as a fraction reads."""

from __future__ import annotations

import torch


def free_device_bytes(device: torch.device) -> int:
    """CUDA: `torch.cuda.mem_get_info`; CPU: MemAvailable of /proc/meminfo."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("memory_budget as a fraction needs MemAvailable in /proc/meminfo")
