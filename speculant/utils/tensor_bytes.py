"""Bytes of the tensors an object holds, found by walking its attributes: a model's weights
for the memory plan, a tensor-parallel rank's holdings."""

from __future__ import annotations

import torch


def tensor_bytes(obj: object) -> int:
    """Bytes of the distinct tensor storages reachable from `obj`'s attributes (a tied lm_head
    and its embedding count once)."""
    seen: dict[int, int] = {}  # storage address (or -id of an opaque tensor) -> bytes
    _collect(obj, seen, set())
    return sum(seen.values())


def largest_packed_bytes(obj: object) -> int:
    """The largest weight pre-packed for oneDNN reachable from `obj`'s attributes (0 if none)."""
    seen: dict[int, int] = {}
    _collect(obj, seen, set())
    return max((nbytes for key, nbytes in seen.items() if key < 0), default=0)


def _collect(obj: object, seen: dict[int, int], visited: set[int]) -> None:
    if id(obj) in visited:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_mkldnn:  # a weight pre-packed for oneDNN: opaque storage of the same size
            seen[-id(obj)] = obj.numel() * obj.element_size()
            return
        storage = obj.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _collect(item, seen, visited)
    elif isinstance(obj, dict):
        for item in obj.values():
            _collect(item, seen, visited)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.device, torch.dtype)):
        for item in vars(obj).values():
            _collect(item, seen, visited)
