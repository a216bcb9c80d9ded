"""The leader's executor (rank 0): the engine's one executor, which runs every forward of the
target and its heads on all ranks together.

For such a forward the leader packs the plan (the `ForwardBatch`: tokens, positions, page
tables, tree masks; device token ids, hidden states) into one message (`channel.py`), broadcasts
it, then runs its own shard; the workers run theirs on the same message, so all ranks enter the
forward's collectives together. A draft LLM is the leader's alone: its weights, its K/V and its
forwards exist on rank 0 only, and its tokens reach the workers inside the verify plan.

The page budget is the leader's: the memory plan counts rank 0's runners (its target shard,
which holds the largest KV-head block, its head shards and any draft LLM) and the page count
is sent to the workers, which allocate their KV heads for the same page ids.

A collective that fails (a worker died: its sockets closed) or waits past `worker_timeout_s`
(a worker hangs) turns into `ExecutorFailed` naming the workers' state; the workers are then
stopped and every later call raises the same error.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import Iterator
from types import SimpleNamespace

import torch

from speculant.attention.batch import build_forward_batch
from speculant.config import EngineConfig
from speculant.distributed.channel import Channel, Op, dtype_code, object_segment
from speculant.distributed.group import TPGroup, rank_config
from speculant.distributed.launch import Workers
from speculant.distributed.loading import cut_checkpoint, head_runner, read_shard, target_runner
from speculant.distributed.sharding import Shard
from speculant.distributed.worker import holdings
from speculant.executor.errors import ExecutorFailed
from speculant.executor.executor import Executor
from speculant.executor.model_runner import ModelRunner
from speculant.executor.plan import TARGET, ForwardPlan, ForwardResult, ModelSpec

_STOP_TIMEOUT_S = 10.0


class TensorParallelExecutor(Executor):
    def __init__(self, config: EngineConfig, checkpoint=None) -> None:
        local, shard = rank_config(config, 0), Shard(0, config.parallel.tensor_parallel_size)
        part = cut_checkpoint(checkpoint, shard) if checkpoint is not None else None  # a model that does not split fails here
        self.workers = Workers(config, checkpoint)
        self._finalizer = weakref.finalize(self, self.workers.stop, 0.0)
        self.workers.wait_for("up")
        group = TPGroup(self.workers.store, shard, torch.device(local.model.device), config.parallel.worker_timeout_s)
        super().__init__(*self._own_shard(local, checkpoint, part, group))
        self.workers.wait_for("ready")
        self.channel = Channel(group)
        self.timeout_s = config.parallel.worker_timeout_s
        self.failure: ExecutorFailed | None = None
        self._lock = threading.Lock()
        self._on_every_rank = [TARGET]  # models whose forwards all ranks run (messages index them)

    def _own_shard(self, config: EngineConfig, checkpoint, part, group: TPGroup):
        """(rank 0's target runner, the checkpoint's sha256 for heads to check); sets the tokenizer.
        Without an in-memory checkpoint, rank 0 reads its slices like every worker."""
        from speculant.loader.head_file import checkpoint_sha256

        source = checkpoint
        if part is None:
            part, checkpoint = read_shard(config.model.model, config.model.torch_dtype, group.shard)
            source = SimpleNamespace(path=checkpoint.path)  # hashed from the file, not the slices
        self.tokenizer = checkpoint.tokenizer
        return target_runner(part, config.model, group), lambda: checkpoint_sha256(source)

    # ---- models and K/V ---------------------------------------------------------------------

    def _head_runner(self, spec: ModelSpec) -> ModelRunner:
        if spec.own_head or spec.head_of != TARGET:
            raise ValueError(f"tensor_parallel_size > 1 runs heads over the target from a head folder, not {spec.name!r}")
        target = self._runner(TARGET)
        head = self._checked_head(spec, target)
        if head.config.feature_layers:
            raise ValueError(
                f"tensor_parallel_size > 1 runs no head that reads the target's feature_layers {list(head.config.feature_layers)} "
                f"(an {head.config.variant} head): run it with tensor_parallel_size=1"
            )
        nbytes, data = object_segment((spec.name, spec.config, head))
        with self._group_call():
            self.channel.send(Op.ADD_MODEL, [nbytes], [data])
        self._on_every_rank.append(spec.name)
        return head_runner(target, head, spec.config)

    def allocate_kv(self, num_pages: int, page_size: int) -> None:
        with self._group_call():
            self.channel.send(Op.ALLOCATE, [num_pages, page_size], [])
        super().allocate_kv(num_pages, page_size)

    def move_kv(self, model: str, src_slots, dst_slots) -> None:
        if model in self._on_every_rank:
            with self._group_call():
                self.channel.send(Op.MOVE_KV, [self._on_every_rank.index(model), src_slots.numel()], [src_slots, dst_slots])
        super().move_kv(model, src_slots, dst_slots)

    def holdings(self) -> list[dict[str, dict[str, int]]]:
        """What each rank holds (`worker.holdings`), rank 0 first; workers report theirs after
        each change, through the rendezvous store."""
        ranks = range(1, self.workers.world_size)
        return [holdings(self)] + [json.loads(self.workers.store.get(f"holdings/{rank}")) for rank in ranks]

    # ---- forwards ---------------------------------------------------------------------------

    def run(self, plan: ForwardPlan) -> ForwardResult:
        if plan.model not in self._on_every_rank:  # a draft LLM: the leader's alone
            return super().run(plan)
        assert self.page_size is not None, "allocate_kv first"
        fb = build_forward_batch(plan.inputs, self.page_size)
        packed = torch.from_numpy(fb.pack())
        extra = [t for t in (plan.input_ids, plan.input_embeds, plan.hidden_states, plan.logits_rows) if t is not None]
        ints = [self._on_every_rank.index(plan.model), packed.numel()] + _sizes(plan)
        with self.span(plan.model), self._group_call():
            self.channel.send(Op.RUN, ints, [packed, *extra])
            return self.forward_batch(plan.model, fb, plan.input_ids, plan.input_embeds, plan.hidden_states, plan.logits_rows)

    @contextlib.contextmanager
    def _group_call(self) -> Iterator[None]:
        """Run one operation's collectives (its message, then its own part), one operation at a
        time: with the engine's step overlap, forwards may come from two threads. Any failure is
        the group's end (ranks may have left mid-forward)."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            try:
                yield
            except Exception as exc:
                self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        """Stop the workers and raise (now and on every later call) an error naming their state."""
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.failure = ExecutorFailed(
            f"a tensor-parallel worker failed or did not answer within {self.timeout_s:g} s "
            f"(worker_timeout_s): {self.workers.describe()} [{cause}]"
        )
        self.workers.stop(0.0)
        raise self.failure from exc

    def close(self) -> None:
        """Stop the workers (STOP message; each closes its connections and says so), close the
        leader's own, then join; idempotent. Closing in this order, rather than in each process's
        teardown, keeps gloo from meeting a peer's closing socket while it tears its own down."""
        with self._lock:
            if self.failure is None and all(p.exitcode is None for p in self.workers.processes):
                with contextlib.suppress(Exception):
                    self.channel.send(Op.STOP, [], [])
                    self.workers.wait_stopped(_STOP_TIMEOUT_S)
                    self.channel.group.shutdown()
            self.failure = self.failure or ExecutorFailed("the tensor-parallel executor is closed")
        self.workers.stop(_STOP_TIMEOUT_S)


def _sizes(plan: ForwardPlan) -> list[int]:
    """RUN's sizes: token ids, input embeddings and hidden states (elements; 0 when absent),
    then the two float tensors' dtype codes, then the logits rows (0 when absent)."""
    ids, embeds, hidden, rows = plan.input_ids, plan.input_embeds, plan.hidden_states, plan.logits_rows
    return [
        0 if ids is None else ids.numel(),
        0 if embeds is None else embeds.numel(),
        0 if hidden is None else hidden.numel(),
        0 if embeds is None else dtype_code(embeds.dtype),
        0 if hidden is None else dtype_code(hidden.dtype),
        0 if rows is None else rows.numel(),
    ]
