"""One tensor-parallel group: a torch.distributed process group held as an object (never the
process-wide default group), so several engines can live in one process.

Every rank builds its own group object with its own timeout: the leader waits at most
`worker_timeout_s` for a worker in any collective, while a worker waits as long as it takes
for the leader's next plan (an idle server sends none). gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from speculant.config import EngineConfig
from speculant.distributed.sharding import Shard


class TPGroup:
    def __init__(self, store: dist.Store, shard: Shard, device: torch.device, timeout_s: float) -> None:
        self.shard, self.device = shard, device
        timeout = datetime.timedelta(seconds=timeout_s)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, shard.rank, shard.world_size, options)
        else:
            self.pg = dist.ProcessGroupGloo(store, shard.rank, shard.world_size, timeout)

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def world_size(self) -> int:
        return self.shard.world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over ranks (in place on a contiguous `x`)."""
        x = x.contiguous()
        self.pg.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] per rank -> [..., world_size * n], rank blocks in order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.pg.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)

    def shutdown(self) -> None:
        """Close this rank's connections now, in order, rather than in the interpreter's teardown
        (where gloo may abort on a peer that is closing its own at the same moment)."""
        self.pg.shutdown()

    def broadcast(self, buf: torch.Tensor) -> None:
        """Rank 0's `buf` into every rank's `buf` (same size everywhere)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.pg.broadcast([buf], options).wait()


def open_store(host: str, port: int, shard: Shard, timeout_s: float) -> dist.TCPStore:
    """The rendezvous: rank 0 serves a TCPStore at host:port, the others connect to it."""
    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(host, port, shard.world_size, shard.rank == 0, timeout=timeout, wait_for_workers=False)


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """The config one rank runs: on CUDA each rank its own device (the configured index plus
    torchrun's LOCAL_RANK, else plus the rank), made current; CPU ranks all run on `cpu`."""
    device = torch.device(config.model.device)
    if device.type != "cuda":
        return config
    index = (device.index or 0) + int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(index)
    return config.replace(model=dataclasses.replace(config.model, device=f"cuda:{index}"))
