"""The executor runs every model forward: it owns the runners, sizes their K/V and drives plans."""

from __future__ import annotations

import sys

import pytest
import torch
from testkit import TinyCheckpoint, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.model_runner import ModelRunner
from speculant.executor.plan import TARGET, ForwardPlan, ModelSpec

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], list(range(10, 30)), [3, 4]]
PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def draft():
    return tiny_hf_model("llama", seed=5, num_hidden_layers=1)


def _executor(hf_model) -> Executor:
    return Executor(build_runner(TinyCheckpoint(hf_model), ModelConfig(model="tiny")))


@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_executor_is_the_only_caller_of_model_forwards(target, draft, method, monkeypatch):
    calls: list[tuple[str, int]] = []  # (calling module, number of layers of the model run)
    forward = ModelRunner.forward

    def recording(self, *args, **kwargs):
        calls.append((sys._getframe(1).f_globals["__name__"], self.arch.num_layers))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward", recording)
    kwargs = dict(speculative=method, num_draft_tokens=3)
    llm = tiny_llm(target, draft, **kwargs) if method == "draft" else tiny_llm(target, **kwargs)
    llm.generate(PROMPTS, PARAMS)
    assert calls and {module for module, _ in calls} == {"speculant.executor.executor"}
    models_run = {layers for _, layers in calls}  # the target has 2 layers, the draft 1
    assert models_run == ({2, 1} if method == "draft" else {2})


def test_pages_count_every_models_kv_bytes(target, draft):
    executor = _executor(target)
    alone = executor.kv_bytes_per_page(4)
    executor.add_model(ModelSpec("draft", ModelConfig(model="tiny-draft"), TinyCheckpoint(draft)))
    assert executor.model_names == [TARGET, "draft"]
    assert executor.kv_bytes_per_page(4) == alone + executor.runner("draft").kv_bytes_per_page(4)
    assert executor.kv_bytes_per_page(4) == alone * 3 // 2  # the draft has one layer of the target's two
    executor.allocate_kv(8, 4)
    assert executor.runner("draft").kv.k.shape[1] == executor.runner().kv.k.shape[1] == 32


def test_bad_model_declarations_are_clear_errors(target, draft):
    executor = _executor(target)
    with pytest.raises(ValueError, match="vocabulary"):
        executor.add_model(ModelSpec("draft", ModelConfig(model="big"), TinyCheckpoint(tiny_hf_model(vocab_size=300))))
    with pytest.raises(ValueError, match="already in use"):
        executor.add_model(ModelSpec(TARGET, ModelConfig(model="tiny"), TinyCheckpoint(draft)))
    with pytest.raises(KeyError, match="no model 'head'"):
        executor.arch("head")
    executor.allocate_kv(8, 4)
    with pytest.raises(RuntimeError, match="page budget"):
        executor.add_model(ModelSpec("draft", ModelConfig(model="tiny-draft"), TinyCheckpoint(draft)))


def test_drive_sends_each_result_back_and_returns_the_value(target):
    executor = _executor(target)
    executor.allocate_kv(8, 4)
    prompt = [5, 6, 7, 8, 9]

    def chain():  # a dependent chain: each forward feeds the previous argmax
        tokens, start, logits = list(prompt), 0, None
        for _ in range(3):
            result = yield ForwardPlan(TARGET, [SeqInput(tokens[start:], start, list(range(8)))])
            logits = result.logits
            start = len(tokens)
            tokens.append(int(logits[0].argmax()))
        return tokens[len(prompt) :]

    drafted = executor.drive(chain())
    fresh = _executor(target)
    fresh.allocate_kv(8, 4)
    whole = fresh.run(ForwardPlan(TARGET, [SeqInput(prompt + drafted[:2], 0, list(range(8)), logits="all")]))
    assert drafted == whole.logits.argmax(dim=-1)[len(prompt) - 1 :].tolist()
    assert whole.hidden.shape == (len(prompt) + 2, target.config.hidden_size)
    assert whole.logits.dtype == torch.float32
