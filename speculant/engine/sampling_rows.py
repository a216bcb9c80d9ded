"""Each request's sampling row, built before a step runs any forward.

A row that cannot be built (a value its tensors cannot hold, a fault in the builder) fails its
own request with an error naming the cause; the rest of the batch runs the step without it.
A request's parameters are frozen, so its row is built once and each step concatenates the rows
of the requests it samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speculant.core import Request
from speculant.sampling.sampler import SamplingTensors


def sampling_row(request: Request, device: torch.device) -> SamplingTensors:
    """One request's row: the single place the engine turns parameters into tensors."""
    return SamplingTensors.from_params([request.params], device)


class SamplingRows:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rows: dict[str, SamplingTensors] = {}

    def build(self, requests: Sequence[Request]) -> dict[Request, str]:
        """Build the rows not built yet; return the requests whose row failed, with the reason."""
        failed = {}
        for request in requests:
            if request.request_id in self._rows:
                continue
            try:
                self._rows[request.request_id] = sampling_row(request, self.device)
            except Exception as exc:  # anything: it must fail this request, not the batch
                failed[request] = f"sampling parameters could not be applied: {type(exc).__name__}: {exc}"
        return failed

    def tensors(self, requests: Sequence[Request]) -> SamplingTensors:
        """The rows of `requests`, in order; each must have been built."""
        return SamplingTensors.cat([self._rows[r.request_id] for r in requests])

    def release(self, request_id: str) -> None:
        self._rows.pop(request_id, None)
