"""The target's feature layers (what an eagle3 head reads, `CausalLM.forward_features`): the
residual stream after each named layer, as transformers' hidden states give it; the native stack
run in segments gives the layer loop's bits; logits are untouched; a model that exposes nothing
never takes the feature path; a family without it refuses, naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.kernels import native
from speculant.models import native_stack

LAYERS = (2, 0, 2)  # any order, repeats allowed: the head's fc reads them as given


def _executor(hf, layers=LAYERS, **config) -> Executor:
    executor = Executor(build_runner(TinyCheckpoint(hf), ModelConfig(model="tiny", **config)))
    if layers:
        executor.expose_features(TARGET, layers)
    executor.allocate_kv(num_pages=16, page_size=4)
    return executor


def _forwards(executor) -> list:
    """Results of a prefill, a decode step, a 4-row verification and a tree."""
    tree = np.tril(np.ones((4, 4), dtype=bool))
    tree[2, 1] = tree[3, 1] = tree[3, 2] = False  # rows 1, 2 and 3 all children of row 0
    pages = list(range(10))
    steps = [
        SeqInput(list(range(3, 30)), 0, pages, logits="all"),
        SeqInput([31], 27, pages, logits="all"),
        SeqInput([32, 33, 34, 35], 28, pages, logits="all"),
        SeqInput([36, 37, 38, 39], 32, pages, logits="all", tree_mask=tree),
    ]
    return [executor.run(ForwardPlan(TARGET, [step])) for step in steps]


ON_CUDA = pytest.param("llama", "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


@pytest.mark.parametrize(("kind", "device"), [("llama", "cpu"), ("qwen3", "cpu"), ON_CUDA])
def test_features_are_the_residual_stream_after_each_layer(kind, device):
    hf = tiny_hf_model(kind, num_hidden_layers=4)
    tokens = list(range(3, 20))
    plan = ForwardPlan(TARGET, [SeqInput(tokens, 0, [0, 1, 2, 3, 4], logits="all")])
    ours = _executor(hf, attention_backend="torch", device=device).run(plan)
    with torch.no_grad():  # transformers' hidden_states[i + 1]: the output of layer i (the last one normed)
        states = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    h = hf.config.hidden_size
    assert ours.hidden.shape == (len(tokens), len(LAYERS) * h)
    for j, layer in enumerate(LAYERS):
        torch.testing.assert_close(ours.hidden[:, j * h : (j + 1) * h].cpu(), states[layer + 1][0], atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not native.available(), reason="the native kernels are not built (no C++ compiler)")
@pytest.mark.parametrize("weights", ["fp32", "int8", "int4"])
def test_the_native_stacks_feature_taps_equal_the_layer_loop_bit_for_bit(weights, monkeypatch):
    hf = tiny_hf_model("llama", num_hidden_layers=4)
    executor = _executor(hf, attention_backend="native", weights=weights)
    calls, taps = [], native_stack.forward_taps
    monkeypatch.setattr(native_stack, "forward_taps", lambda *a: calls.append(1) or taps(*a))
    stacked = _forwards(executor)
    assert len(calls) == 4, "every forward took the native stack's taps"
    monkeypatch.setattr(native_stack, "runs", lambda ctx, x: False)
    looped = _forwards(executor)
    for a, b in zip(stacked, looped, strict=True):
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.logits, b.logits)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_logits_are_plain_decodings_and_plain_decoding_takes_no_feature_path(backend, monkeypatch):
    if backend == "native" and not native.available():
        pytest.skip("the native kernels are not built (no C++ compiler)")
    hf = tiny_hf_model("llama", num_hidden_layers=4)
    featured = _forwards(_executor(hf, layers=(1, 2, 3), attention_backend=backend))
    plain_executor = _executor(hf, layers=(), attention_backend=backend)
    model = plain_executor.runner(TARGET).model
    monkeypatch.setattr(model, "forward_features", lambda *a, **k: pytest.fail("plain decoding took the feature path"))
    plain = _forwards(plain_executor)
    h = hf.config.hidden_size
    for f, p in zip(featured, plain, strict=True):
        assert torch.equal(f.logits, p.logits)
        assert torch.equal(f.hidden[:, 2 * h :], p.hidden)  # layer 3, the last: the plain forward's states


def test_a_family_without_feature_layers_refuses_naming_the_field():
    with pytest.raises(ValueError, match="feature_layers: the deepseek_v3 model exposes no layer outputs"):
        _executor(tiny_hf_model("deepseek"), layers=(0, 1, 2))


def test_one_model_exposes_one_set_of_layers():
    executor = Executor(build_runner(TinyCheckpoint(tiny_hf_model("llama")), ModelConfig(model="tiny")))
    executor.expose_features(TARGET, (0, 1, 1))
    executor.expose_features(TARGET, (0, 1, 1))  # the same again: fine
    with pytest.raises(ValueError, match=r"feature_layers: the target model already exposes layers \[0, 1, 1\]"):
        executor.expose_features(TARGET, (1, 1, 1))
