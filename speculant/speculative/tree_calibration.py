"""The verify cost of every tree size, measured once at start-up for the tree budget
(`tree_budget.TreeBudget`): target forwards verifying 1..budget + 1 tokens (a chain's tree mask)
over a context of up to CALIBRATION_CONTEXT tokens, in scratch pages given back after."""

from __future__ import annotations

import time

from speculant.attention.batch import SeqInput
from speculant.executor.plan import TARGET, ForwardPlan, Forwards
from speculant.kv_cache.allocator import PageTables
from speculant.sampling import tree_shape
from speculant.speculative.tree_budget import measure_points

CALIBRATION_ID = "<tree budget calibration>"  # the page-table id of the start-up measurement
CALIBRATION_CONTEXT = 1024  # tokens of context the verify cost is measured over
CALIBRATION_REPEATS = 3  # forwards timed per size (the fastest counts)


def measure_verify_seconds(pages: PageTables, max_position: int, budget: int) -> Forwards[dict[int, float]]:
    """{verified tokens: seconds of the fastest of CALIBRATION_REPEATS target forwards}."""
    capacity = min(max_position, pages.allocator.num_pages * pages.page_size)
    context = max(1, min(CALIBRATION_CONTEXT, capacity - budget - 2))
    pages.ensure(CALIBRATION_ID, context + budget + 1)
    table = pages.table(CALIBRATION_ID)
    seconds = {}
    try:
        yield ForwardPlan(TARGET, [SeqInput([0] * context, 0, table, logits="none")])
        for t in measure_points(budget):
            chain = [-1] + list(range(t - 2))
            mask, positions = tree_shape.verify_mask(chain[: t - 1]), tree_shape.verify_positions(chain[: t - 1], context)
            step = [SeqInput([0] * t, context, table, positions=positions, logits="all", tree_mask=mask)]
            times = []
            for _ in range(CALIBRATION_REPEATS):
                start = time.perf_counter()
                yield ForwardPlan(TARGET, step)
                times.append(time.perf_counter() - start)
            seconds[t] = min(times)
    finally:
        pages.release(CALIBRATION_ID)
    return seconds
