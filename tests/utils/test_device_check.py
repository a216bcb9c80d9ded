"""The device-mixing check: host tensors (made without a device, or moved to the host) may not
meet device tensors in one op during a checked step, even on a CPU machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speculant.utils import sync
from speculant.utils.device_check import DeviceMixError, device_check, is_host

DEVICE = torch.device("cpu")  # the engine's device: named by a torch.device




@pytest.fixture
def weights():
    return torch.ones(4)  # made before the step, like a model's weights: a device tensor


@pytest.fixture
def step(weights):
    with device_check(), sync.guarded_step(strict=False):
        yield


def test_host_and_device_tensors_are_told_apart(step, weights):
    assert is_host(torch.tensor([1, 2])) and is_host(torch.zeros(3)) and is_host(torch.as_tensor(np.zeros(2)))
    made = torch.zeros(3, device=DEVICE)
    moved = torch.tensor([1, 2]).to(DEVICE)
    assert not is_host(made) and not is_host(moved) and not is_host(weights * 2)
    assert is_host(moved.to("cpu")) and is_host(weights.cpu()) and is_host(torch.tensor([3]) + 1)


@pytest.mark.parametrize(
    "op",
    [
        lambda w, h: w + h,
        lambda w, h: w.index_select(0, h),
        lambda w, h: w[h],
        lambda w, h: w.index_copy_(0, h, w[:2]),
        lambda w, h: torch.cat([w, h.float()]),
    ],
)
def test_an_op_mixing_host_and_device_tensors_fails(step, weights, op):
    host = torch.tensor([0, 1])
    with pytest.raises(DeviceMixError, match="mixes host tensors"):
        op(weights, host)


def test_transfers_and_host_scalars_are_allowed(step, weights):
    index = torch.tensor([0, 1]).to(DEVICE, non_blocking=True)
    assert weights.index_select(0, index).shape == (2,)
    assert (weights * torch.tensor(2.0)).shape == (4,)  # a 0-d host scalar, as CUDA allows


def test_nothing_is_checked_outside_a_checked_step():
    torch.ones(4) + torch.tensor([1, 2, 3, 4]).to(DEVICE) + torch.tensor([1, 2, 3, 4])
