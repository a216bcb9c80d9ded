"""The decoder stack as one native call gives the Python layer loop's bits: prefill, a decode
step, a verification of several rows and a tree, in every weight mode the native kernels run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testkit import tiny_hf_model, tiny_llm

from speculant.attention.batch import SeqInput
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.kernels import native
from speculant.models import native_stack

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)")


def _forwards(llm) -> list[torch.Tensor]:
    """Logits and hidden states of a prefill, a decode step, a 4-row verification and a tree."""
    executor, allocator, page_size = llm.engine.executor, llm.engine.pages.allocator, llm.engine.pages.page_size
    pages = allocator.allocate(-(-40 // page_size))
    tree = np.tril(np.ones((4, 4), dtype=bool))
    tree[2, 1] = tree[3, 1] = tree[3, 2] = False  # rows 1, 2 and 3 all children of row 0
    steps = [
        SeqInput(list(range(3, 30)), 0, pages, logits="all"),
        SeqInput([31], 27, pages, logits="all"),
        SeqInput([32, 33, 34, 35], 28, pages, logits="all"),
        SeqInput([36, 37, 38, 39], 32, pages, logits="all", tree_mask=tree),
    ]
    out = []
    for step in steps:
        result = executor.run(ForwardPlan(TARGET, [step]))
        out += [result.logits, result.hidden]
    allocator.free(pages)
    return out


@pytest.mark.parametrize("weights", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "tied"])
def test_the_native_stack_equals_the_layer_loop(kind, weights, monkeypatch):
    llm = tiny_llm(tiny_hf_model(kind), weights=weights, attention_backend="native", speculative="none")
    model = llm.engine.executor.runner(TARGET).model
    assert model._native_stack() is not None, "every product of the tiny model runs natively"
    calls, forward = [], native_stack.forward
    monkeypatch.setattr(native_stack, "forward", lambda *a: calls.append(1) or forward(*a))
    stacked = _forwards(llm)
    assert len(calls) == 4  # each forward took the stack
    monkeypatch.setattr(native_stack, "runs", lambda ctx, x: False)
    looped = _forwards(llm)
    for a, b in zip(stacked, looped, strict=True):
        assert torch.equal(a, b)


def test_the_stack_stands_aside_where_a_piece_is_not_native():
    llm = tiny_llm(tiny_hf_model("llama"), weights="fp32", attention_backend="torch", speculative="none")
    model = llm.engine.executor.runner(TARGET).model
    calls = []
    model._stack = type("Spy", (), {"forward": lambda self, *a: calls.append(a)})()
    _forwards(llm)
    assert calls == []  # the torch backend's plan: the layer loop ran
