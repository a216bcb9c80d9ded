"""The parting finder of `speculant.bench.divergence`: first differing token, the plain run's margin there."""

from __future__ import annotations

import pytest

from speculant.bench.divergence import first_divergence, parting


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # one ended early


def test_parting_reports_the_plain_margin_and_whether_the_runner_up_was_taken():
    tops = [[(1, -0.1), (9, -3.0)], [(2, -0.70), (5, -0.71)], [(3, -0.2), (4, -2.0)]]
    assert parting([1, 2, 3], tops, [1, 2, 3]) is None
    found = parting([1, 2, 3], tops, [1, 5, 7])
    assert found["position"] == 1 and found["runner_up"] is True
    assert found["margin"] == pytest.approx(0.01)
    assert parting([1, 2, 3], tops, [1, 2, 8])["runner_up"] is False
    assert parting([1, 2, 3], tops, [1, 2])["margin"] is None  # an early stop has no margin to read


def test_the_tool_finds_no_parting_where_speculation_is_exact(tmp_path, tiny_checkpoint, monkeypatch):
    """End to end on a tiny fp32 model (its checkpoint loaded once for every engine): greedy
    n-gram speculation equals plain decoding, so nothing parts."""
    import json

    import speculant.executor.loading as loading
    from speculant.bench.divergence import main

    loads = []
    monkeypatch.setattr(loading, "load_checkpoint_for", lambda name, config: loads.append(name) or tiny_checkpoint)
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a b c a b c a b", "Hello there")))
    result = main(["--model", "tiny", "--page-size", "4", "--num-pages", "256", "--methods", "ngram:k=2:adaptive_k=false",
                   "--dataset", str(dataset), "--num-prompts", "2", "--max-tokens", "8", "--output", str(tmp_path / "div.json")])
    assert loads == ["tiny"]
    assert result["rows"] == [{"method": "ngram:k=2:adaptive_k=false", "prompts": 2, "parted": 0, "max_margin": None, "runner_up": 0}]
    assert json.loads((tmp_path / "div.json").read_text())["partings"]["ngram:k=2:adaptive_k=false"][0]["item"]
