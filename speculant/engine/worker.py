"""The step worker: one thread that runs a step's device stage (forwards, acceptance, launch,
the host read) so the host can schedule the next step meanwhile (`SchedulerConfig.overlap`).

On an accelerator the forwards are launched asynchronously anyway; on a CPU this thread is
what lets host work overlap them. Torch's per-thread state (grad mode, the strict-sync and
device-check modes) is carried over from the thread that submits the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from speculant.engine.timeline import Timeline
from speculant.utils.device_check import check_enabled
from speculant.utils.sync import guarded_step, strict_enabled

T = TypeVar("T")


class StepWorker:
    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speculant-step")

    def submit(self, stage: Callable[..., T], *args) -> Future[T]:
        grad, strict, check = torch.is_grad_enabled(), strict_enabled(), check_enabled()
        submitted = time.perf_counter()

        def run() -> T:
            with torch.set_grad_enabled(grad), self.timeline.worker(submitted), guarded_step(strict, check):
                return stage(*args)

        return self._thread.submit(run)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
