"""A tensor-parallel worker (rank > 0): load this rank's slices, then run what the leader sends.

A worker never schedules or samples: it runs the target's and the heads' forwards the leader
broadcasts (`channel.Op`), writing its KV heads into the same page ids as the leader, until
STOP. Rendezvous is a TCPStore at the leader (host, port): workers the leader starts are handed
them (`run_worker.py`), torchrun's ranks read MASTER_ADDR / MASTER_PORT (`launch.py`).
"""

from __future__ import annotations

import json
import traceback

import torch

from speculant.attention.batch import ForwardBatch
from speculant.config import EngineConfig
from speculant.distributed.channel import Channel, Message, Op, code_dtype
from speculant.distributed.group import TPGroup, open_store, rank_config
from speculant.distributed.loading import ShardCheckpoint, head_runner, load_part, target_runner
from speculant.distributed.sharding import Shard
from speculant.executor.executor import Executor
from speculant.executor.plan import TARGET
from speculant.utils.tensor_bytes import tensor_bytes

IDLE_TIMEOUT_S = 7 * 24 * 3600.0  # a worker waits this long for the leader's next message
STARTUP_TIMEOUT_S = 600.0  # for the rendezvous


def worker_main(rank: int, world_size: int, host: str, port: int, config: EngineConfig, part: ShardCheckpoint | None = None) -> None:
    """A worker process's whole life; an error is written to the store for the leader, then raised."""
    shard, config = Shard(rank, world_size), rank_config(config, rank)
    store = open_store(host, port, shard, STARTUP_TIMEOUT_S)
    store.set(f"up/{rank}", "1")
    try:
        group = TPGroup(store, shard, torch.device(config.model.device), IDLE_TIMEOUT_S)
        executor = Executor(target_runner(load_part(config, shard, part), config.model, group))
        store.set(f"ready/{rank}", "ok")
    except BaseException:
        store.set(f"ready/{rank}", traceback.format_exc())
        raise
    try:
        Worker(executor, Channel(group), lambda: store.set(f"holdings/{rank}", json.dumps(holdings(executor)))).serve()
    except BaseException:
        store.set(f"failed/{rank}", traceback.format_exc())
        raise
    group.shutdown()  # after STOP: close this rank's connections, then tell the leader
    store.set(f"stopped/{rank}", "1")


def holdings(executor: Executor) -> dict[str, dict[str, int]]:
    """What this rank holds, by model: its own tensors' bytes (a head's shared embedding and
    lm_head count with the target), its K/V bytes, and for the target the elements of its
    sharded weights (q/k/v, o, gate/up, down, embedding, lm_head)."""
    out, seen = {}, []
    for name in executor.model_names:
        runner = executor.runner(name)
        kv = 0 if runner.kv is None else runner.kv.k.nbytes + (0 if runner.layout.values_in_keys else runner.kv.v.nbytes)
        own = tensor_bytes([*seen, runner.model]) - tensor_bytes(seen)
        out[name] = {"weight_bytes": own, "kv_bytes": kv}
        seen.append(runner.model)
    out[TARGET]["sharded_elements"] = sharded_elements(executor.runner(TARGET).model)
    return out


def sharded_elements(model) -> int:
    products = [p for layer in model.layers for p in (layer.qkv, layer.o.inner, layer.gate_up, layer.down.inner)]
    head = model.lm_head.inner
    tied = getattr(head, "weight", None) is model.embed_tokens
    return sum(p.shape.numel() for p in products) + model.embed_tokens.numel() + (0 if tied else head.shape.numel())


class Worker:
    def __init__(self, executor: Executor, channel: Channel, report=lambda: None) -> None:
        self.executor, self.channel, self.report = executor, channel, report
        self.models = [TARGET]  # the models every rank runs, in the leader's order (messages index them)

    def serve(self) -> None:
        handlers = {Op.RUN: self._run, Op.MOVE_KV: self._move_kv, Op.ALLOCATE: self._allocate, Op.ADD_MODEL: self._add_model}
        self.report()
        while True:
            message = self.channel.receive()
            if message.op == Op.STOP:
                return
            handlers[message.op](message)
            if message.op in (Op.ALLOCATE, Op.ADD_MODEL):
                self.report()  # what this rank holds changed

    @torch.inference_mode()
    def _run(self, m: Message) -> None:
        model, fb_len, num_ids, embeds_numel, hidden_numel, embeds_dtype, hidden_dtype, num_rows = m.ints[:8]
        fb = ForwardBatch.unpack(m.host_int64(fb_len))
        ids = m.segment(num_ids, torch.int64) if num_ids else None
        embeds = m.segment(embeds_numel, code_dtype(embeds_dtype)).view(fb.num_tokens, -1) if embeds_numel else None
        hidden = m.segment(hidden_numel, code_dtype(hidden_dtype)).view(fb.num_tokens, -1) if hidden_numel else None
        rows = m.segment(num_rows, torch.int64) if num_rows else None
        self.executor.forward_batch(self.models[model], fb, ids, embeds, hidden, rows)

    def _move_kv(self, m: Message) -> None:
        model, count = m.ints[:2]
        src, dst = m.segment(count, torch.int64), m.segment(count, torch.int64)
        self.executor.move_kv(self.models[model], src.clone(), dst.clone())

    def _allocate(self, m: Message) -> None:
        num_pages, page_size = m.ints[:2]
        self.executor.allocate_kv(num_pages, page_size)

    def _add_model(self, m: Message) -> None:
        name, model_config, head = m.object(m.ints[0])
        self.executor.add_runner(name, head_runner(self.executor.runner(TARGET), head, model_config))
        self.models.append(name)
