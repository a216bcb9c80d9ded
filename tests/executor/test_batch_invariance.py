"""A row computes the same in every forward: the logits (and cached K/V) of a token are bit for bit
the same whether it runs alone as a one-row decode step, inside a (k+1)-row verification, on a
draft tree's path among siblings, inside a batch beside other sequences' prefill chunks and
decode steps, or in a prefill chunk of another length, in every weight mode.

This is what makes greedy speculation exact and a request's tokens independent of its batch-mates.
It holds on the native kernels (`speculant.kernels`); the pure-torch fallback is row-dependent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testkit import TinyCheckpoint, ancestor_mask, tiny_hf_model

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)")

MODES = ["fp32", "bf16", "int8", "int4"]
PAGE = 4
PROMPT = [1, 17, 33, 5, 99, 42, 7, 7, 120, 64, 3]
CHAIN = [11, 200, 45, 9, 150]  # the tokens a decode would append, one per step


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_model("qwen2", seed=11)  # q/k/v bias too


def _executor(hf_model, weights: str) -> Executor:
    executor = Executor(build_runner(TinyCheckpoint(hf_model), ModelConfig(model="tiny", weights=weights)))
    executor.allocate_kv(num_pages=64, page_size=PAGE)
    return executor


class Pages:
    """Page tables handed out from a fresh executor's cache, a sequence at a time."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, tokens: int) -> list[int]:
        n = -(-tokens // PAGE)
        self.next += n
        return list(range(self.next - n, self.next))


def _run(executor: Executor, inputs: list[SeqInput]) -> torch.Tensor:  # [rows with logits, vocab]
    return executor.run(ForwardPlan(TARGET, inputs)).logits


def _one_row_steps(executor: Executor, pages: list[int]) -> torch.Tensor:  # [len(CHAIN), vocab]
    """Prefill PROMPT, then decode CHAIN one token a forward: the logits after each token."""
    _run(executor, [SeqInput(PROMPT, 0, pages)])
    rows = [_run(executor, [SeqInput([t], len(PROMPT) + i, pages)]) for i, t in enumerate(CHAIN)]
    return torch.cat(rows)


def _kv_rows(executor: Executor, pages: list[int], n: int) -> torch.Tensor:  # [layers, n, ...]
    k = executor.runner(TARGET).kv.k
    slots = torch.tensor([pages[i // PAGE] * PAGE + i % PAGE for i in range(n)])
    return k[:, slots]


@pytest.mark.parametrize("weights", MODES)
def test_verify_rows_equal_one_row_steps(hf_model, weights):
    executor, pages = _executor(hf_model, weights), Pages()
    alone = pages.take(len(PROMPT) + len(CHAIN))
    steps = _one_row_steps(executor, alone)
    verify = pages.take(len(PROMPT) + len(CHAIN))
    _run(executor, [SeqInput(PROMPT, 0, verify)])
    rows = _run(executor, [SeqInput(CHAIN, len(PROMPT), verify, logits="all")])
    assert torch.equal(rows, steps)
    assert rows.dtype == torch.float32
    n = len(PROMPT) + len(CHAIN)
    assert torch.equal(_kv_rows(executor, verify, n), _kv_rows(executor, alone, n))


@pytest.mark.parametrize("weights", MODES)
def test_rows_equal_inside_a_batch_of_other_sequences(hf_model, weights):
    executor, pages = _executor(hf_model, weights), Pages()
    steps = _one_row_steps(executor, pages.take(len(PROMPT) + len(CHAIN)))
    mine, other, third = (pages.take(40) for _ in range(3))
    _run(executor, [SeqInput(PROMPT, 0, mine), SeqInput(list(range(3, 30)), 0, third)])
    batch = [
        SeqInput(list(range(40, 57)), 0, other),  # another request's prefill chunk
        SeqInput(CHAIN, len(PROMPT), mine, logits="all"),  # our verification
        SeqInput([8], 27, third),  # another request's decode step
    ]
    logits = _run(executor, batch)  # [1 + len(CHAIN) + 1, vocab]
    assert torch.equal(logits[1 : 1 + len(CHAIN)], steps)


@pytest.mark.parametrize("weights", MODES)
def test_a_tree_path_equals_the_chain(hf_model, weights):
    """CHAIN[:3] as a path of a tree with siblings at every depth: its rows equal one-row steps."""
    executor, pages = _executor(hf_model, weights), Pages()
    steps = _one_row_steps(executor, pages.take(len(PROMPT) + len(CHAIN)))
    tokens = [CHAIN[0], 77, CHAIN[1], 78, 79, CHAIN[2]]
    parents = [-1, -1, 0, 0, 1, 2]
    depth = [0, 0, 1, 1, 1, 2]
    tree = pages.take(len(PROMPT) + len(tokens))
    _run(executor, [SeqInput(PROMPT, 0, tree)])
    positions = [len(PROMPT) + d for d in depth]
    seq = SeqInput(tokens, len(PROMPT), tree, positions=positions, logits="all", tree_mask=ancestor_mask(parents))
    logits = _run(executor, [seq])
    assert torch.equal(logits[[0, 2, 5]], steps[:3])


@pytest.mark.parametrize("weights", MODES)
def test_prefill_chunking_leaves_logits_unchanged(hf_model, weights):
    executor, pages = _executor(hf_model, weights), Pages()
    whole = pages.take(len(PROMPT))
    one_chunk = _run(executor, [SeqInput(PROMPT, 0, whole, logits="all")])
    chunked, rows, start = pages.take(len(PROMPT)), [], 0
    for size in (3, 1, 5, 2):
        rows.append(_run(executor, [SeqInput(PROMPT[start : start + size], start, chunked, logits="all")]))
        start += size
    assert torch.equal(torch.cat(rows), one_chunk)


def test_the_comparisons_see_a_row_dependent_forward(hf_model, monkeypatch):
    """The tests above would be hollow if every forward were row-invariant: a product whose
    rows depend on the row count (one extra rounding of multi-row outputs) is caught."""
    from speculant.layers import linear

    call = linear.Int8Linear.__call__

    def row_dependent(self, x):
        out = call(self, x)
        return out if x.shape[0] == 1 else out.bfloat16().float()

    monkeypatch.setattr(linear.Int8Linear, "__call__", row_dependent)
    executor, pages = _executor(hf_model, "int8"), Pages()
    steps = _one_row_steps(executor, pages.take(len(PROMPT) + len(CHAIN)))
    verify = pages.take(len(PROMPT) + len(CHAIN))
    _run(executor, [SeqInput(PROMPT, 0, verify)])
    assert not torch.equal(_run(executor, [SeqInput(CHAIN, len(PROMPT), verify, logits="all")]), steps)


def test_native_attention_equals_the_torch_reference(hf_model):
    """The native backend attends as SDPA does (within float32 rounding) on causal and tree batches."""
    logits = {}
    for backend in ("native", "torch"):
        config = ModelConfig(model="tiny", attention_backend=backend)
        executor = Executor(build_runner(TinyCheckpoint(hf_model), config))
        executor.allocate_kv(num_pages=64, page_size=PAGE)
        pages = Pages()
        a, b = pages.take(30), pages.take(30)
        _run(executor, [SeqInput(PROMPT, 0, a)])
        mask = ancestor_mask([-1, 0, 0, 1])
        batch = [
            SeqInput(CHAIN, len(PROMPT), a, logits="all"),
            SeqInput(list(np.arange(20, 33)), 0, b, logits="all"),
        ]
        causal = _run(executor, batch)
        tree = _run(executor, [SeqInput([5, 6, 7, 8], len(PROMPT), a, positions=[11, 12, 12, 13], logits="all", tree_mask=mask)])
        logits[backend] = torch.cat([causal, tree])
    torch.testing.assert_close(logits["native"], logits["torch"], rtol=1e-5, atol=1e-5)
