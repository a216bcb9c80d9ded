"""The step profile charges a real forward's CPU time to kinds of work that add up to the total."""

from __future__ import annotations

import pytest

from speculant.bench import step_profile


@pytest.mark.real_model
def test_the_kinds_add_up_to_each_forward(tmp_path):
    result = step_profile.main(["--rows", "1", "3", "--repeats", "1", "--context", "16", "--output", str(tmp_path / "p.json")])
    assert [r["rows"] for r in result] == [1, 3] and result[0]["M/1"] == 1.0 and result[0]["wall M/1"] == 1.0
    for row in result:
        assert row["wall"] > 0 and row["int4"] > 0 and row["attention"] > 0  # smollm2's layers are int4 in the default mode
        assert abs(sum(row[k] for k in step_profile.KINDS) - row["total"]) < 0.05
    assert (tmp_path / "p.json").exists()
