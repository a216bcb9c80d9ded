"""Strict sync mode: every host read outside `speculant.utils.sync` raises inside a guarded step,
CPU tensors included; sanctioned reads pass and are counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speculant.utils import sync

HIDDEN_READS = {
    ".item()": lambda t: t[0].item(),
    ".tolist()": lambda t: t.tolist(),
    ".cpu()": lambda t: t.cpu(),
    ".numpy()": lambda t: t.numpy(),
    "bool(tensor)": lambda t: bool(t[0]),
    "int(tensor)": lambda t: int(t[0]),
    "float(tensor)": lambda t: float(t[0]),
    "Python index": lambda t: [1, 2, 3][t[0]],
    "numpy of a tensor": lambda t: np.asarray(t),
    "nonzero": lambda t: t.nonzero(),
    "boolean-mask": lambda t: t[t > 0],
    "repeat_interleave": lambda t: t.repeat_interleave(torch.tensor([1, 2])),
    "torch.tensor of tensors": lambda t: torch.tensor([t[0], t[1]]),
    "f-string": lambda t: f"{t[0]}",
    "repr": lambda t: repr(t),
}


@pytest.mark.parametrize("read", HIDDEN_READS.values(), ids=HIDDEN_READS.keys())
def test_strict_step_refuses_hidden_reads_of_cpu_tensors(read):
    t = torch.tensor([1, 0])
    read(t)  # outside a step: allowed
    with sync.strict_sync(), sync.guarded_step(), pytest.raises(sync.HostReadError, match="speculant.utils.sync"):
        read(t)


def test_device_only_work_passes_and_sanctioned_reads_are_counted():
    t = torch.tensor([3, 1, 2])
    with sync.strict_sync(), sync.guarded_step():
        before = sync.host_reads()
        doubled = (t * 2).sort().values  # device work: no read
        repeated = t.repeat_interleave(torch.tensor([1, 2, 0]), output_size=3)  # size given: no read
        assert sync.to_list(doubled) == [2, 4, 6]
        tokens, counts = sync.read_lists([repeated, t.argmax()])  # one sync for both
        assert sync.host_reads() - before == 2
    assert tokens == [3, 1, 1] and counts == 0


def test_guarded_step_is_inert_unless_strict(monkeypatch):
    monkeypatch.delenv(sync.STRICT_ENV, raising=False)
    with sync.guarded_step():
        assert torch.tensor(1).item() == 1
    monkeypatch.setenv(sync.STRICT_ENV, "1")
    assert sync.strict_enabled()
    with sync.guarded_step(), pytest.raises(sync.HostReadError):
        torch.tensor(1).item()
