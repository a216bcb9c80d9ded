"""What a step's device stage uses of its engine. The stage functions (`sample_step`,
`chain_verify`, `tree_verify`) take these parts, not the engine, so their inputs are in sight
and they never touch request state, the scheduler or the outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.engine.logit_rows import LogitControls
from speculant.engine.sampling_rows import SamplingRows
from speculant.engine.timeline import Timeline
from speculant.engine.token_pool import TokenPool
from speculant.executor.executor import Executor
from speculant.kv_cache.allocator import PageTables
from speculant.speculative.base import Proposer


@dataclass(frozen=True)
class StageParts:
    executor: Executor  # runs the step's target forward and the proposer's launched forwards
    proposer: Proposer  # launches what it can from device tensors before the step's read
    pages: PageTables  # each sequence's page table (a tree's accepted K/V is moved within it)
    pool: TokenPool  # device token ids: forward inputs gathered, emitted tokens scattered
    rows: SamplingRows  # each request's sampling row, built before the step
    generator: torch.Generator  # the engine's noise for rows without a seed
    timeline: Timeline  # the step's spans (the read)
    controls: LogitControls  # grammar masks, bans, biases and penalties of each forward row
