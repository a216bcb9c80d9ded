"""Start-up calibration of the step cost model: the points fit the cache, the fit recovers a
linear cost law, the first start measures and caches, a later start reads the cache."""

from __future__ import annotations

import json

import pytest
from testkit import tiny_hf_model, tiny_llm

from speculant.kv_cache.allocator import PageAllocator, PageTables
from speculant.speculative import calibration
from speculant.speculative.cost_model import StepCostModel


def test_points_cover_batch_tokens_and_context_within_capacity():
    pts = calibration.points(k_max=4, max_seqs=64, capacity=100_000, max_position=4096)
    assert {(b, t) for b, t, _ in pts} == {(1, t) for t in range(1, 6)} | {(b, t) for b in (8, 32) for t in (1, 2, 5)}
    assert {c for _, _, c in pts} == {calibration.SHORT_CONTEXT, calibration.LONG_CONTEXT, calibration.SHORT_CONTEXT * 8 // 32}
    assert len({b * c for b, _, c in pts if b > 1}) == 1  # the batches hold one total context: rows alone set them apart
    small = calibration.points(k_max=4, max_seqs=2, capacity=300, max_position=128)
    assert all(b <= 2 and b * (t + c) <= 300 and t + c <= 128 for b, t, c in small) and small


def test_calibrated_model_recovers_a_linear_law():
    law = lambda ks, context: 0.004 + 0.0015 * sum(k + 1 for k in ks) + 0.002 * context / 1000  # noqa: E731
    pts = calibration.points(k_max=4, max_seqs=64, capacity=100_000, max_position=4096)
    samples = [([t - 1] * b, b * c, law([t - 1] * b, b * c)) for b, t, c in pts]
    model = StepCostModel.calibrated(samples)
    for ks, c in [([2], 100), ([3] * 5, 2000)]:
        assert model.predict(ks, c) == pytest.approx(law(ks, c), rel=1e-6)


def test_first_start_measures_and_caches_then_the_cache_is_read(tmp_path, monkeypatch, target):
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path))
    draft = tiny_hf_model("llama", seed=5, num_hidden_layers=1)
    first = tiny_llm(target, draft, num_draft_tokens=3, adaptive_k=True).stats()["step_cost_calibration"]
    assert len(first) >= 6 and all(seconds > 0 for _, _, seconds in first)
    cached = json.loads((tmp_path / "step_cost.json").read_text())
    assert list(cached.values()) == [[list(s) for s in first]]

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cached calibration must not be measured again")

    monkeypatch.setattr(calibration, "measure", no_measuring)
    again = tiny_llm(target, draft, num_draft_tokens=3, adaptive_k=True).stats()
    assert again["step_cost_calibration"] == first
    other_k = tiny_llm(target, draft, num_draft_tokens=6, adaptive_k=True).stats()  # k <= MIN_K: the same entry
    assert other_k["step_cost_calibration"] == first
    assert "step_cost_calibration" not in tiny_llm(target, draft, num_draft_tokens=3, adaptive_k=False).stats()  # fixed k: none


def test_points_are_prefilled_once_per_batch_and_context_then_timed_in_turns_and_the_pages_given_back():
    """One prefill per (batch, context); then every point in turns, ROUNDS times over, so a slow
    spell of the machine cannot make one row count, batch or context alone look slow."""
    pages = PageTables(PageAllocator(1024), page_size=16)
    forwards = calibration.measure(pages, k_max=2, max_seqs=8, max_position=4096)
    shapes = []  # (sequences, tokens per sequence, KV start) of every forward
    try:
        plan = next(forwards)
        while True:
            shapes.append((len(plan.inputs), len(plan.inputs[0].token_ids), plan.inputs[0].kv_start))
            plan = forwards.send(None)
    except StopIteration as stop:
        samples = stop.value
    pts = calibration.points(2, 8, 1024 * 16, 4096)
    groups = list(dict.fromkeys((b, c) for b, _, c in pts))
    assert shapes[: len(groups)] == [(b, c, 0) for b, c in groups]  # the prefills
    assert shapes[len(groups) :] == [(b, t, c) for b, t, c in pts] * calibration.ROUNDS  # every point, in turns
    assert sorted((len(ks), ks[0] + 1, c // len(ks)) for ks, c, _ in samples) == sorted(pts)
    assert pages.allocator.num_free == 1024
