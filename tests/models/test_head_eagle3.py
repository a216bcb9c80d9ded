"""The eagle3 head: its paged forward over the target's feature layers (then over its own states)
equals the training math, its own lm_head scores its draft vocabulary, the native stack runs its
layer with the loop's bits, and head files keep its feature layers (bad ones refused by name)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan, ModelSpec
from speculant.loader.errors import CheckpointError
from speculant.loader.head_file import (
    HeadCheckpoint,
    HeadFileConfig,
    checkpoint_sha256,
    load_head,
    save_head,
)
from speculant.models.head import (
    build_modules,
    head_arch,
    head_forward,
    head_logits,
    init_head_weights,
)
from speculant.models.head_features import default_feature_layers, fuse_if_features

LAYERS = (0, 1, 1)


def causal_attend(q, k, v):  # [T, heads, d], [T, kv_heads, d] -> [T, heads * d]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1).reshape(q.shape[0], -1)


def setup(vocab_map=None, layers=LAYERS, weights_mode="fp32", kind="llama", device="cpu"):
    ckpt = TinyCheckpoint(tiny_hf_model(kind))
    config = ModelConfig(model="tiny", weights=weights_mode, device=device)
    executor = Executor(build_runner(ckpt, config), lambda: checkpoint_sha256(ckpt))
    arch = head_arch(ckpt.arch)
    weights = init_head_weights(arch, "eagle3", seed=3, std=0.1, draft_vocab=0 if vocab_map is None else len(vocab_map))
    if vocab_map is not None:
        weights["vocab_map"] = vocab_map
    cfg = HeadFileConfig("eagle3", "tiny", checkpoint_sha256(ckpt), arch.hidden_size, 0 if vocab_map is None else len(vocab_map), feature_layers=layers)
    executor.add_model(ModelSpec("head", config, HeadCheckpoint(cfg, weights), head_of=TARGET))
    executor.allocate_kv(num_pages=32, page_size=4)
    return ckpt, executor, weights


ON_CUDA = pytest.param("llama", "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


@pytest.mark.parametrize("vocab_map", [None, torch.tensor([2, 10, 11, 40, 200])])
@pytest.mark.parametrize(("kind", "device"), [("llama", "cpu"), ("qwen2", "cpu"), ON_CUDA])
def test_paged_forward_equals_training_math(vocab_map, kind, device):
    """The target's features through the head in two chunks, then a draft step on the head's
    own output state: the training functions' logits and states, and -inf outside the map."""
    ckpt, executor, weights = setup(vocab_map, kind=kind, device=device)
    arch, n, h = head_arch(ckpt.arch), 9, ckpt.arch.hidden_size
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, arch.vocab_size, (n + 1,), generator=g)
    target = executor.run(ForwardPlan(TARGET, [SeqInput(tokens[:n].tolist(), 0, [0, 1, 2], logits="none")]))
    features = target.hidden  # [n, 3h]
    assert features.shape == (n, 3 * h)
    table = [3, 4, 5]
    first = executor.run(ForwardPlan("head", [SeqInput(tokens[1:6].tolist(), 0, table, logits="all")], hidden_states=features[:5]))
    second = executor.run(ForwardPlan("head", [SeqInput(tokens[6 : n + 1].tolist(), 5, table, logits="all")], hidden_states=features[5:]))
    own = executor.run(ForwardPlan("head", [SeqInput([7], n, table, logits="all")], hidden_states=second.hidden[-1:]))  # [1, h] in
    first, second, own, features = (_cpu(first), _cpu(second), _cpu(own), features.cpu())  # the training math runs on the CPU

    m = build_modules({k: v for k, v in weights.items() if k != "vocab_map"}, arch, "eagle3")
    cos, sin = (t.cpu() for t in executor.runner("head").model.rotary.lookup(torch.arange(n + 1, device=device)))
    embeds = F.embedding(torch.cat([tokens[1:], torch.tensor([7])]), ckpt.weights["model.embed_tokens.weight"])
    dense = head_forward(arch, m, embeds[:n], features, cos[:n], sin[:n], causal_attend)  # the fused features in
    torch.testing.assert_close(torch.cat([first.hidden, second.hidden]), dense, atol=2e-5, rtol=1e-4)
    logits = head_logits(arch, m, dense, lm_head=None)  # [n, Nk] the head's own lm_head
    paged = torch.cat([first.logits, second.logits])
    scored = paged if vocab_map is None else paged[:, vocab_map]
    torch.testing.assert_close(scored, logits, atol=2e-4, rtol=1e-4)
    if vocab_map is not None:
        assert torch.isinf(paged).sum() == n * (arch.vocab_size - len(vocab_map))
    # entry n reads the head's own state at entry n - 1 ([1, h]: no fusion), attending to every entry
    fused_then_own = torch.cat([fuse_if_features(m.fuse, features), dense[-1:]])  # [n + 1, h]
    joined = head_forward(arch, m, embeds, fused_then_own, cos, sin, causal_attend)
    torch.testing.assert_close(own.hidden, joined[-1:], atol=2e-5, rtol=1e-4)


def test_the_head_scores_with_its_own_lm_head():
    vocab_map = torch.tensor([3, 5, 7])
    _, executor, weights = setup(vocab_map)
    head, target = executor.runner("head").model, executor.runner().model
    assert torch.equal(head.draft_lm_head.weight, weights["lm_head.weight"])  # its own rows, not the target's
    assert not torch.equal(head.draft_lm_head.weight, target.lm_head.weight[vocab_map])


def test_feature_layer_defaults():
    assert default_feature_layers(32) == (2, 16, 29)
    assert default_feature_layers(2) == (1, 1, 0)  # a tiny target: brought into its layers


def test_head_file_round_trip_keeps_the_feature_layers(tmp_path):
    ckpt, _, weights = setup(torch.tensor([1, 2, 3]))
    cfg = HeadFileConfig("eagle3", "tiny", checkpoint_sha256(ckpt), ckpt.arch.hidden_size, 3, {"steps": 5}, feature_layers=LAYERS)
    save_head(tmp_path / "h", weights, cfg)
    assert json.loads((tmp_path / "h" / "head.json").read_text())["feature_layers"] == list(LAYERS)
    loaded = load_head(tmp_path / "h", expect_sha256=cfg.target_sha256)
    assert loaded.config == cfg and loaded.config.feature_layers == LAYERS
    assert set(loaded.weights) == set(weights) and all(torch.equal(loaded.weights[k], weights[k]) for k in weights)
    executor = Executor(build_runner(ckpt, ModelConfig(model="tiny")), lambda: checkpoint_sha256(ckpt))
    executor.add_model(ModelSpec("head", ModelConfig(model=str(tmp_path / "h")), head_of=TARGET))
    executor.allocate_kv(num_pages=8, page_size=4)
    out = executor.run(ForwardPlan(TARGET, [SeqInput([4, 5, 6], 0, [0], logits="all")]))
    assert out.hidden.shape == (3, 3 * ckpt.arch.hidden_size)  # the target now exposes the head's layers


@pytest.mark.parametrize(
    ("variant", "layers", "error"),
    [
        ("eagle3", (0, 1), "feature_layers: an eagle3 head reads 3 target layers, got \\[0, 1\\]"),
        ("eagle3", (0, -1, 1), "feature_layers: layer indices from 0"),
        ("eagle3", (), "feature_layers: an eagle3 head names the target layers it reads"),
        ("normed", (0, 1, 1), "feature_layers: .* other variants none; got variant 'normed'"),
    ],
)
def test_bad_feature_layers_in_a_head_file_are_refused_by_name(tmp_path, variant, layers, error):
    with pytest.raises(ValueError, match=error):
        HeadFileConfig(variant, "tiny", "x", 64, feature_layers=layers)
    folder = tmp_path / "h"
    folder.mkdir()
    good = HeadFileConfig("eagle3", "tiny", "x", 64, feature_layers=LAYERS)
    (folder / "head.json").write_text(json.dumps(dataclasses.asdict(good) | {"variant": variant, "feature_layers": list(layers)}))
    (folder / "head.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=error):
        load_head(folder)


def test_feature_layers_past_the_targets_are_refused_by_name():
    with pytest.raises(ValueError, match=r"feature_layers: the target has layers 0..1, got \[0, 1, 2\]"):
        setup(layers=(0, 1, 2))


def _cpu(result):  # a ForwardResult's tensors on the CPU
    return type(result)(result.logits.cpu(), result.hidden.cpu())
