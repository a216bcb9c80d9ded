"""`python -m speculant.bench.row_diff` names the first op that computes a row differently in a
verification than in a one-row step, and finds none on the native kernels."""

from __future__ import annotations

import pytest
from testkit import tiny_hf_model, tiny_llm

from speculant.bench.row_diff import run
from speculant.kernels import native
from speculant.layers import linear


@pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)")
def test_row_diff_finds_nothing_on_the_native_kernels_and_names_a_row_dependent_op(monkeypatch):
    llm = tiny_llm(tiny_hf_model("llama"), weights="int8")
    prompt, chain = [1, 5, 9, 13, 17], [21, 25, 29, 33]
    assert run(llm, prompt, chain) is None
    call = linear.Int8Linear.__call__
    monkeypatch.setattr(linear.Int8Linear, "__call__", lambda self, x: call(self, x) * (1 + 1e-3 * (x.shape[0] > 1)))
    found = run(llm, prompt, chain)
    assert found is not None and found["op"] == "aten.mul" and found["max_abs_diff"] > 0
