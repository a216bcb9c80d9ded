"""The engine's executor: one rank's, or the leader's of a tensor-parallel group. The factory
lives above both executors, so the base executor never imports its subclass."""

from __future__ import annotations

from speculant.config import EngineConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import load_target


def create_executor(config: EngineConfig, checkpoint=None) -> tuple[Executor, object]:
    """(executor, the target's tokenizer) for the engine: one rank's, or the leader of a
    tensor-parallel group (`speculant.distributed`) when `tensor_parallel_size` > 1."""
    if config.parallel.tensor_parallel_size > 1:
        from speculant.distributed.leader import TensorParallelExecutor

        executor = TensorParallelExecutor(config, checkpoint)
        return executor, executor.tokenizer
    target, tokenizer, target_sha256 = load_target(config, checkpoint)
    return Executor(target, target_sha256), tokenizer
