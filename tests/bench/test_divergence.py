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
