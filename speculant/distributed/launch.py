"""Starting the workers of a tensor-parallel group and watching them.

On one node the leader serves the rendezvous store on a free local port and starts ranks
1..N-1 as processes of their own (`python -m speculant.distributed.run_worker`, `processes.py`).
Under torchrun every rank runs the same command: rank 0 becomes the leader, the others workers
(`speculant.cli` hands them `run_torchrun_worker`), and the rendezvous is torchrun's MASTER_ADDR /
MASTER_PORT (the env:// convention).
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path

from speculant.config import EngineConfig
from speculant.distributed.group import open_store
from speculant.distributed.loading import cut_checkpoint
from speculant.distributed.processes import WorkerProcess, remove_folder, start_workers
from speculant.distributed.sharding import Shard
from speculant.distributed.worker import STARTUP_TIMEOUT_S, worker_main

_POLL_S = 0.05


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it (RANK and WORLD_SIZE set), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"])
    return None


def run_torchrun_worker(config: EngineConfig) -> int:
    """A torchrun rank > 0: serve the leader until it stops; the exit status."""
    rank, world = int(os.environ["RANK"]), _torchrun_world(config)
    worker_main(rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")), config)
    return 0


def _torchrun_world(config: EngineConfig) -> int:
    world = int(os.environ["WORLD_SIZE"])
    if world != config.parallel.tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size={config.parallel.tensor_parallel_size} but torchrun started WORLD_SIZE={world} ranks")
    return world


class Workers:
    """The leader's view of ranks 1..N-1: the rendezvous store, and the processes it started."""

    def __init__(self, config: EngineConfig, checkpoint=None) -> None:
        world = config.parallel.tensor_parallel_size
        self.processes: list[WorkerProcess] = []
        self.folder: Path | None = None
        if torchrun_rank() is not None:
            host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
            _torchrun_world(config)
        else:
            host, port = "127.0.0.1", 0  # port 0: the store binds a free one
        self.store = open_store(host, port, Shard(0, world), STARTUP_TIMEOUT_S)
        self.world_size = world
        if torchrun_rank() is None:
            parts = [cut_checkpoint(checkpoint, Shard(rank, world)) if checkpoint is not None else None for rank in range(1, world)]
            self.folder, self.processes = start_workers(world, host, self.store.port, config, parts)

    def wait_for(self, stage: str) -> None:
        """Block until every worker has written `stage/<rank>` ("up": at the rendezvous, "ready":
        weights loaded); raise with the worker's own traceback, or its exit status and the tail
        of its output, if one failed."""
        keys = [f"{stage}/{rank}" for rank in range(1, self.world_size)]
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.store.check(keys):
            self._raise_if_exited(f"before it was {stage}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel workers were not {stage} within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(_POLL_S)
        for rank, key in enumerate(keys, start=1):
            value = self.store.get(key).decode()
            if stage == "ready" and value != "ok":
                raise RuntimeError(f"tensor-parallel worker rank {rank} failed to load its shard:\n{value}")

    def _raise_if_exited(self, when: str) -> None:
        for p in self.processes:
            if p.exitcode is not None:
                raise RuntimeError(f"tensor-parallel worker rank {p.rank} {describe_exit(p.exitcode)} {when}{_output(p)}")

    def describe(self, settle_s: float = 1.0) -> str:
        """Each started worker's state (with the tail of an exited one's output), and any
        traceback a worker left, for an error message. A killed worker's sockets close before
        its exit is seen: wait up to `settle_s` for it."""
        deadline = time.monotonic() + settle_s
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        states = [f"rank {p.rank} {describe_exit(p.exitcode)}{_output(p)}" if p.exitcode is not None else f"rank {p.rank} still running" for p in self.processes]
        for rank in range(1, self.world_size):
            if self.store.check([f"failed/{rank}"]):
                states.append(f"rank {rank} reported:\n{self.store.get(f'failed/{rank}').decode()}")
        return "; ".join(states) if states else "workers started by torchrun"

    def wait_stopped(self, timeout_s: float) -> None:
        """Block until every worker has closed its connections after STOP (`stopped/<rank>`)."""
        keys = [f"stopped/{rank}" for rank in range(1, self.world_size)]
        self.store.wait(keys, datetime.timedelta(seconds=timeout_s))

    def stop(self, timeout_s: float) -> None:
        """Wait for the started workers; kill those still running after `timeout_s`; remove
        their temporary folder. Idempotent."""
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            p.kill()
            p.join()
            p.release()
        remove_folder(self.folder)
        self.folder = None


def _output(process: WorkerProcess) -> str:
    tail = process.tail()
    return f"; its last output:\n{tail}\n" if tail else " (no output)"


def describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with status {exitcode}"
