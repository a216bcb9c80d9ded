"""The draft head: shared target tensors, the paged forward equal to the training math, the
reduced vocabulary, and head files (round trip, DeepSeek names, the wrong target refused)."""

from __future__ import annotations

import dataclasses

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


def causal_attend(q, k, v):  # [T, heads, d], [T, kv_heads, d] -> [T, heads * d]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1).reshape(q.shape[0], -1)


def setup(variant="normed", vocab_map=None, kind="llama"):
    ckpt = TinyCheckpoint(tiny_hf_model(kind))
    config = ModelConfig(model="tiny")
    executor = Executor(build_runner(ckpt, config), lambda: checkpoint_sha256(ckpt))
    weights = init_head_weights(head_arch(ckpt.arch), variant, seed=3, std=0.1)
    if vocab_map is not None:
        weights["vocab_map"] = vocab_map
    head_cfg = HeadFileConfig(variant, "tiny", checkpoint_sha256(ckpt), ckpt.arch.hidden_size, len(vocab_map) if vocab_map is not None else 0)
    executor.add_model(ModelSpec("head", config, HeadCheckpoint(head_cfg, weights), head_of=TARGET))
    executor.allocate_kv(num_pages=16, page_size=4)
    return ckpt, executor, weights


def test_head_shares_the_targets_embedding_and_scores_its_lm_head_rows():
    vocab_map = torch.tensor([3, 5, 7])
    ckpt, executor, _ = setup(vocab_map=vocab_map)
    target, head = executor.runner().model, executor.runner("head").model
    assert torch.equal(head.draft_lm_head.weight, target.lm_head.weight[vocab_map])  # its own product over the map's rows
    ids = torch.tensor([4, 9])
    assert torch.equal(head.embed(ids), target.embed(ids))
    assert head.arch.num_layers == 1 and executor.runner("head").kv.k.shape[0] == 1


@pytest.mark.parametrize("variant", ["normed", "eagle"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_paged_forward_equals_training_math(variant, kind):
    ckpt, executor, weights = setup(variant, kind=kind)
    arch, n = head_arch(ckpt.arch), 11
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, arch.hidden_size, generator=g)
    tokens = torch.randint(0, arch.vocab_size, (n,), generator=g)
    table = [0, 1, 2]
    # two chunks through the pages: entries 0..6, then 7..10
    first = executor.run(ForwardPlan("head", [SeqInput(tokens[:7].tolist(), 0, table, logits="all")], hidden_states=hidden[:7]))
    second = executor.run(ForwardPlan("head", [SeqInput(tokens[7:].tolist(), 7, table, logits="all")], hidden_states=hidden[7:]))
    paged_out = torch.cat([first.hidden, second.hidden])
    paged_logits = torch.cat([first.logits, second.logits])

    target = executor.runner().model
    m = build_modules(weights, arch, variant)
    cos, sin = executor.runner("head").model.rotary.lookup(torch.arange(n))
    dense_out = head_forward(arch, m, target.embed(tokens), hidden, cos, sin, causal_attend)
    dense_logits = head_logits(arch, m, dense_out, ckpt.weights["lm_head.weight"])
    torch.testing.assert_close(paged_out, dense_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(paged_logits, dense_logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_native_stack_equals_the_layer_loop_bit_for_bit(weights):
    """Where the native stack can run the head's layer it does, with the layer loop's bits."""
    ckpt = TinyCheckpoint(tiny_hf_model("llama"))
    config = ModelConfig(model="tiny", weights=weights)
    executor = Executor(build_runner(ckpt, config), lambda: checkpoint_sha256(ckpt))
    weights_ = init_head_weights(head_arch(ckpt.arch), "normed", seed=3, std=0.1)
    head_cfg = HeadFileConfig("normed", "tiny", checkpoint_sha256(ckpt), ckpt.arch.hidden_size, 0)
    executor.add_model(ModelSpec("head", config, HeadCheckpoint(head_cfg, weights_), head_of=TARGET))
    executor.allocate_kv(num_pages=16, page_size=4)
    head = executor.runner("head").model
    hidden = torch.randn(5, ckpt.arch.hidden_size, generator=torch.Generator().manual_seed(1))
    plan = ForwardPlan("head", [SeqInput([4, 8, 9, 1, 3], 0, [0, 1], logits="all")], hidden_states=hidden)
    stacked = executor.run(plan)
    assert head._stack is not False, "the forward did not reach the native stack"
    if head._stack is None:
        pytest.skip("the native kernels are not built here")
    head._stack = None  # the layer loop from now on
    looped = executor.run(plan)
    assert torch.equal(stacked.hidden, looped.hidden) and torch.equal(stacked.logits, looped.logits)


def test_device_token_ids_replace_the_plans():
    ckpt, executor, _ = setup()
    hidden = torch.randn(3, ckpt.arch.hidden_size)
    a = executor.run(ForwardPlan("head", [SeqInput([5, 6, 7], 0, [0], logits="all")], hidden_states=hidden))
    b = executor.run(ForwardPlan("head", [SeqInput([0, 0, 0], 0, [0], logits="all")], input_ids=torch.tensor([5, 6, 7]), hidden_states=hidden))
    assert torch.equal(a.logits, b.logits)


def test_reduced_vocabulary_scores_only_the_map():
    vocab_map = torch.tensor([2, 10, 11, 200])
    ckpt, executor, weights = setup(vocab_map=vocab_map)
    _, full_executor, _ = setup()  # same seed: same head weights, full vocabulary
    hidden = torch.randn(2, ckpt.arch.hidden_size)
    plan = ForwardPlan("head", [SeqInput([4, 8], 0, [0], logits="all")], hidden_states=hidden)
    reduced, full = executor.run(plan).logits, full_executor.run(plan).logits
    outside = torch.ones(ckpt.arch.vocab_size, dtype=torch.bool)
    outside[vocab_map] = False
    assert torch.isinf(reduced[:, outside]).all()
    torch.testing.assert_close(reduced[:, vocab_map], full[:, vocab_map])
    assert torch.softmax(reduced, -1)[:, outside].sum() == 0


def test_head_file_round_trip_and_target_check(tmp_path):
    ckpt, executor, weights = setup(vocab_map=torch.tensor([1, 2, 3]))
    cfg = HeadFileConfig("normed", "tiny", checkpoint_sha256(ckpt), ckpt.arch.hidden_size, 3, {"steps": 5})
    save_head(tmp_path / "h", weights, cfg)
    loaded = load_head(tmp_path / "h", expect_sha256=cfg.target_sha256)
    assert loaded.config == cfg and set(loaded.weights) == set(weights)
    assert all(torch.equal(loaded.weights[k], weights[k]) for k in weights)
    with pytest.raises(CheckpointError, match="trained for target 'tiny'"):
        load_head(tmp_path / "h", expect_sha256="0" * 64)
    with pytest.raises(CheckpointError, match="head.json"):
        load_head(tmp_path / "missing")


def test_executor_refuses_a_head_for_another_target(tmp_path):
    ckpt, _, weights = setup()
    other = TinyCheckpoint(tiny_hf_model(seed=1))
    save_head(tmp_path / "h", weights, HeadFileConfig("normed", "tiny-0", checkpoint_sha256(ckpt), ckpt.arch.hidden_size))
    executor = Executor(build_runner(other, ModelConfig(model="tiny")), lambda: checkpoint_sha256(other))
    with pytest.raises(CheckpointError, match="trained for target 'tiny-0'"):
        executor.add_model(ModelSpec("head", ModelConfig(model=str(tmp_path / "h")), head_of=TARGET))


def test_deepseek_mtp_names_map_onto_the_normed_head(tmp_path):
    from safetensors.torch import save_file

    ckpt, _, weights = setup()
    renamed = {}
    for name, t in weights.items():
        if name.startswith("layer."):
            renamed["model.layers.2." + name.removeprefix("layer.")] = t
        elif name == "norm.weight":
            renamed["model.layers.2.shared_head.norm.weight"] = t
        else:
            renamed["model.layers.2." + name] = t
    renamed["model.layers.2.shared_head.head.weight"] = torch.zeros(4, 4)  # the target's, dropped
    (tmp_path / "h").mkdir()
    save_file(renamed, str(tmp_path / "h" / "head.safetensors"))
    cfg = HeadFileConfig("normed", "tiny", "x", ckpt.arch.hidden_size)
    (tmp_path / "h" / "head.json").write_text(__import__("json").dumps(dataclasses.asdict(cfg)))
    loaded = load_head(tmp_path / "h")
    assert set(loaded.weights) == set(weights)
