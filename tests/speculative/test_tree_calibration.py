"""The tree budget's start-up measurement: one prefill, then every measured verify size timed
CALIBRATION_REPEATS times over the same scratch pages, given back after."""

from __future__ import annotations

from testkit import tiny_llm

from speculant.speculative.tree_budget import measure_points
from speculant.speculative.tree_calibration import CALIBRATION_REPEATS, measure_verify_seconds


def test_every_size_is_timed_and_the_pages_go_back(target):
    llm = tiny_llm(target)
    engine = llm.engine
    free = engine.pages.allocator.num_free
    sizes = []
    forwards = measure_verify_seconds(engine.pages, target.config.max_position_embeddings, 6)
    plan = next(forwards)
    try:
        while True:
            engine.executor.run(plan)
            plan = forwards.send(None)
            sizes.append(sum(len(s.token_ids) for s in plan.inputs))
    except StopIteration as done:
        seconds = done.value
    assert sorted(seconds) == measure_points(6) == [1, 2, 4, 7]
    assert all(v > 0 for v in seconds.values())
    assert sizes == [t for t in measure_points(6) for _ in range(CALIBRATION_REPEATS)]
    assert engine.pages.allocator.num_free == free
