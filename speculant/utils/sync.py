"""Every device-to-host read goes through here, so syncs can be counted and hidden ones caught.

`to_host`, `to_list`, `read_all` and `read_lists` are the only sanctioned reads. Strict mode
(`SPECULANT_STRICT_SYNC=1`, or `strict_sync()` in tests) makes every other read raise while an
engine step runs (`guarded_step`): `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()`,
`int()`, `float()`, using a tensor as a Python index, and the ops whose output size an
accelerator must read first (`nonzero`, boolean-mask indexing, `repeat_interleave` without
`output_size`, `torch.tensor` of tensors). CPU tensors are held to it too, so a CPU run catches
every read a GPU would pay for. It also counts reads of CPU tensors, so a step's reads can be
asserted (`host_reads`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode

from speculant.utils.device_check import DeviceMixCheck, check_enabled

_local = threading.local()
STRICT_ENV = "SPECULANT_STRICT_SYNC"


class HostReadError(RuntimeError):
    """A device-to-host read outside `speculant.utils.sync` during a strict engine step."""


_reads = [0]  # process-wide: a step's read may happen on its worker thread
_reads_lock = threading.Lock()


def host_reads() -> int:
    """Device-to-host reads of accelerator tensors (and of CPU tensors where counted) so far."""
    return _reads[0]


@contextlib.contextmanager
def counting_cpu_reads() -> Iterator[None]:
    """Count reads of CPU tensors too (tests: the reads a step would make on an accelerator)."""
    before = getattr(_local, "cpu", False)
    _local.cpu = True
    try:
        yield
    finally:
        _local.cpu = before


def strict_enabled() -> bool:
    """Strict mode is on for this thread (`strict_sync`) or for the process (the environment)."""
    return getattr(_local, "strict", False) or os.environ.get(STRICT_ENV, "") not in ("", "0")


@contextlib.contextmanager
def strict_sync() -> Iterator[None]:
    """Engine steps run by this thread inside the block are strict (and count CPU reads)."""
    before = getattr(_local, "strict", False)
    _local.strict = True
    try:
        yield
    finally:
        _local.strict = before


@contextlib.contextmanager
def guarded_step(strict: bool | None = None, check: bool | None = None) -> Iterator[None]:
    """The scope of one engine step (or of its worker's share): strict when `strict` (default:
    `strict_enabled()`), checked for device mixing when `check` (default: the device check's
    switch), else nothing. Modes are per thread: a worker enters its own scope with the flags
    of the thread that started the step."""
    with contextlib.ExitStack() as stack:
        if strict_enabled() if strict is None else strict:
            stack.enter_context(counting_cpu_reads())
            stack.enter_context(_StrictMode())
        if check_enabled() if check is None else check:
            stack.enter_context(DeviceMixCheck())
        yield


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU; counts a sync when `t` lives on an accelerator."""
    return read_all([t])[0]


def to_list(t: torch.Tensor) -> list:
    return _sanctioned(lambda: to_host(t).tolist())


def read_all(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Every tensor on the CPU through one sync: non-blocking copies, then one wait (one read)."""
    if any(t.device.type != "cpu" for t in tensors) or getattr(_local, "cpu", False):
        with _reads_lock:
            _reads[0] += 1
    return _sanctioned(lambda: _copy_all(tensors))


def read_lists(tensors: Sequence[torch.Tensor]) -> list[list]:
    """`read_all`, each tensor as (nested) Python lists."""
    return _sanctioned(lambda: [t.tolist() for t in read_all(tensors)])


def _copy_all(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if not any(t.device.type == "cuda" for t in tensors):
        return [t.to("cpu") for t in tensors]
    debug = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)  # the sanctioned sync, even under set_sync_debug_mode("error")
    try:
        host = [t.to("cpu", non_blocking=True) for t in tensors]
        torch.cuda.current_stream().synchronize()
        return host
    finally:
        torch.cuda.set_sync_debug_mode(debug)


def _sanctioned(read):
    before = getattr(_local, "reading", False)
    _local.reading = True
    try:
        return read()
    finally:
        _local.reading = before


_READS = {
    torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.cpu: ".cpu()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__bool__: "bool(tensor)",
    torch.Tensor.__int__: "int(tensor)",
    torch.Tensor.__float__: "float(tensor)",
    torch.Tensor.__index__: "a tensor used as a Python index",
    torch.Tensor.__array__: "numpy of a tensor",
    torch.Tensor.__format__: "formatting a tensor",
    torch.Tensor.__repr__: "printing a tensor",
    torch.Tensor.nonzero: "nonzero (output size read from the device)",
    torch.nonzero: "nonzero (output size read from the device)",
    torch.Tensor.masked_select: "masked_select (output size read from the device)",
}


def hidden_read(func, args: tuple, kwargs: dict) -> str | None:
    """What device-to-host read `func(*args, **kwargs)` makes, or None."""
    if func in _READS:
        return _READS[func]
    if func is torch.Tensor.__getitem__ and _has_bool_tensor(args[1]):
        return "boolean-mask indexing (output size read from the device)"
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        if isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and kwargs.get("output_size") is None:
            return "repeat_interleave with tensor repeats and no output_size"
    if func is torch.tensor and isinstance(args[0], (list, tuple)) and any(isinstance(x, torch.Tensor) for x in args[0]):
        return "torch.tensor of tensors"
    if func is torch.Tensor.to and _to_host(args, kwargs) and args[0].device.type != "cpu":
        return ".to('cpu')"
    return None


def _has_bool_tensor(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _to_host(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"


class _StrictMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not getattr(_local, "reading", False):
            reason = hidden_read(func, args, kwargs)
            if reason is not None:
                raise HostReadError(f"{reason} during an engine step: read through speculant.utils.sync")
        return func(*args, **kwargs)
