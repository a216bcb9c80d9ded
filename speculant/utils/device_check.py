"""Catch ops that mix host tensors with device tensors, on a CPU machine.

On a CPU engine every tensor lives in the same memory, so an op that would fail (or copy and
sync) on an accelerator because it mixes a host tensor with a device tensor runs silently. With
the check on (`SPECULANT_DEVICE_CHECK=1`, or `device_check()` in tests), each engine step runs
under a `__torch_function__` mode that tracks which tensors are *host* tensors:

- made without a device: `torch.tensor(list)`, `torch.as_tensor(array)`, a factory without
  `device=` or with `device="cpu"` (the string names the host);
- moved to the host: `.cpu()`, `.to("cpu")`;
- computed only from host tensors.

Everything else is a device tensor: made with an explicit `device=` (the engine's device, even
when it is the CPU), moved with `.to(device)`, computed from a device tensor, or made before the
step (weights, K/V, carried state). An op whose inputs include both a device tensor and a host
tensor of one or more dimensions raises `DeviceMixError` (0-d host scalars are allowed, as on
CUDA); `.to(device)` is the explicit way across. `torch.from_numpy` does not pass through torch
function modes, so its result counts as a device tensor: move it with `.to(device)` anyway.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CHECK_ENV = "SPECULANT_DEVICE_CHECK"
_HOST = "_speculant_host"  # attribute set on host tensors made during a checked step
_local = threading.local()


class DeviceMixError(RuntimeError):
    """An op mixed a host tensor with a device tensor during a checked engine step."""


def check_enabled() -> bool:
    return getattr(_local, "on", False) or os.environ.get(CHECK_ENV, "") not in ("", "0")


@contextlib.contextmanager
def device_check() -> Iterator[None]:
    """Engine steps run by this thread inside the block check for device mixing."""
    before = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


def is_host(t: torch.Tensor) -> bool:
    return getattr(t, _HOST, False)


class DeviceMixCheck(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        host = [t for t in tensors if is_host(t)]
        device = [t for t in tensors if not is_host(t)]
        moved = _destination(func, args, kwargs)
        if moved is None and host and device and any(t.dim() > 0 for t in host):
            raise DeviceMixError(f"{_name(func)} mixes host tensors {_shapes(host)} with device tensors {_shapes(device)}")
        out = func(*args, **kwargs)
        if moved is not None and any(out is t for t in tensors):  # `.to` returned its input: tag a view
            out = out.view_as(out)
        on_host = moved if moved is not None else (not device if tensors else True)
        return tree_map(lambda x: _tag(x, on_host) if isinstance(x, torch.Tensor) else x, out)


def _destination(func, args: tuple, kwargs: dict) -> bool | None:
    """Where a transfer or a factory with a `device` lands: True on the host, False on the
    device; None for any other op (or a `.to` that changes only the dtype). The string "cpu"
    names the host; a `torch.device` names the engine's device, even when that is the CPU."""
    if func is torch.Tensor.cpu:
        return True
    if func is torch.Tensor.cuda:
        return False
    target = kwargs.get("device")
    if func is torch.Tensor.to and target is None and len(args) > 1:
        target = args[1]
    if isinstance(target, torch.Tensor):
        return is_host(target)
    if isinstance(target, (str, torch.device)):
        return isinstance(target, str) and target == "cpu"
    return None


def _tag(t: torch.Tensor, on_host: bool) -> torch.Tensor:
    if on_host:
        setattr(t, _HOST, True)
    elif is_host(t):
        delattr(t, _HOST)
    return t


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _shapes(tensors: list[torch.Tensor]) -> str:
    return ", ".join(str(tuple(t.shape)) for t in tensors[:3])
