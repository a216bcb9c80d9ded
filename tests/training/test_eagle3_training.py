"""Training an eagle3 head: the shards hold the target's feature layers as the inference path
exposes them (other layers refused, naming the folder to delete), the head trains, resumes bit
for bit and saves its own lm_head (the target's tensors stay frozen and unsaved), the trained
head through the executor computes what training computed, a frozen lm_head stays the target's
rows, a head started from a target layer reads its highest feature layer, and bad options are
refused."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan, ModelSpec
from speculant.loader.head_file import checkpoint_sha256, load_head
from speculant.training.batches import build_batch, sequence_refs
from speculant.training.hidden import HiddenOptions, Sequence, load_shards, precompute
from speculant.training.objective import HeadObjective
from speculant.training.trainer import TrainOptions, train

LAYERS = (0, 1, 1)  # the tiny target has two layers
FAST = TrainOptions(variant="eagle3", feature_layers=LAYERS, steps=6, batch_tokens=64, lr=3e-3, warmup_steps=2,
                    checkpoint_every=2, draft_vocab=120, unroll=2)  # fmt: skip
HIDDEN = HiddenOptions(top_k=8, max_seq_len=64, forward_tokens=64, shard_tokens=60, page_size=4)


def _sequences() -> list[Sequence]:
    g = torch.Generator().manual_seed(0)
    out = []
    for n in range(7):
        prompt = torch.randint(3, 260, (4,), generator=g).tolist()
        out.append(Sequence(prompt + [10 + (n + i) % 7 for i in range(12 + 3 * n)], prompt_len=4))
    return out


@pytest.fixture(scope="module")
def feature_dir(tmp_path_factory, checkpoint):
    folder = tmp_path_factory.mktemp("features")
    precompute(checkpoint, ModelConfig(model="tiny"), _sequences(), folder, dataclasses.replace(HIDDEN, feature_layers=LAYERS), progress=False)
    return folder


def test_shards_hold_the_feature_layers_the_inference_path_exposes(feature_dir, checkpoint):
    manifest, shards = load_shards(feature_dir)
    assert manifest["settings"]["feature_layers"] == list(LAYERS)
    executor = Executor(build_runner(checkpoint, ModelConfig(model="tiny")))
    executor.expose_features(TARGET, LAYERS)
    executor.allocate_kv(32, 4)
    seq = _sequences()[1]
    shard, refs = shards[0], sequence_refs(shards)
    ref = refs[1]
    assert shard["tokens"][ref.start : ref.start + ref.length].tolist() == seq.tokens
    features = executor.run(ForwardPlan(TARGET, [SeqInput(seq.tokens, 0, list(range(16)), logits="none")])).hidden
    assert shard["hidden"].shape[1] == 3 * checkpoint.arch.hidden_size
    assert torch.equal(shard["hidden"][ref.start : ref.start + ref.length], features.to(torch.bfloat16))


def test_shards_of_other_layers_are_refused(feature_dir, checkpoint, target, tmp_path):
    with pytest.raises(ValueError, match=rf"holds the states of feature layers \[0, 1, 1\], this run needs the last layer; delete {re.escape(str(feature_dir))}"):
        precompute(checkpoint, ModelConfig(model="tiny"), _sequences(), feature_dir, HIDDEN, progress=False)
    with pytest.raises(ValueError, match=r"holds the states of feature layers \[0, 1, 1\], this head reads feature layers \[1, 1, 1\]; delete"):
        train(feature_dir, tmp_path, target, dataclasses.replace(FAST, feature_layers=(1, 1, 1)), progress=False)
    with pytest.raises(ValueError, match="this head reads the last layer; delete"):
        train(feature_dir, tmp_path, target, TrainOptions(steps=1), progress=False)


def test_training_resumes_bit_for_bit_and_saves_its_own_lm_head(tmp_path, feature_dir, target, checkpoint):
    train(feature_dir, tmp_path / "straight", target, FAST, progress=False)
    train(feature_dir, tmp_path / "resumed", target, FAST, progress=False, stop_after=3)
    train(feature_dir, tmp_path / "resumed", target, FAST, progress=False)
    a, b = load_head(tmp_path / "straight" / "head"), load_head(tmp_path / "resumed" / "head")
    assert a.weights.keys() == b.weights.keys() and all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert a.config.variant == "eagle3" and a.config.feature_layers == LAYERS and a.config.training["feature_layers"] == list(LAYERS)
    vocab_map = a.weights["vocab_map"]
    lm_head = a.weights["lm_head.weight"]  # [Nk, H], started from the target's rows and trained
    assert lm_head.shape == (120, target.arch.hidden_size)
    assert not torch.equal(lm_head, target.lm_head[vocab_map])
    assert not any("embed" in k for k in a.weights)
    assert target.embed.data_ptr() == checkpoint.weights["model.embed_tokens.weight"].data_ptr() and not target.embed.requires_grad


def test_a_frozen_lm_head_stays_the_targets_rows_while_the_rest_trains(tmp_path, feature_dir, target):
    train(feature_dir, tmp_path, target, dataclasses.replace(FAST, freeze_lm_head=True), progress=False)
    head = load_head(tmp_path / "head")
    assert torch.equal(head.weights["lm_head.weight"], target.lm_head[head.weights["vocab_map"]])
    assert not torch.equal(head.weights["fc.weight"], load_head(_untrained(feature_dir, target, tmp_path)).weights["fc.weight"])
    with pytest.raises(ValueError, match="freeze_lm_head: only the eagle3 variant"):
        TrainOptions(variant="normed", freeze_lm_head=True)


def test_init_layer_passes_the_highest_feature_layer_into_the_copied_layer(tmp_path, feature_dir, target):
    train(feature_dir, tmp_path / "lr0", target, dataclasses.replace(FAST, lr=0.0, steps=1, init_layer=1), progress=False)
    weights = load_head(tmp_path / "lr0" / "head").weights
    h = target.arch.hidden_size
    assert torch.equal(weights["fc.weight"], torch.cat([torch.zeros(h, 2 * h), torch.eye(h)], dim=1))
    assert all(torch.equal(weights[k], v) for k, v in target.layer(1).items())


def _untrained(feature_dir, target, tmp_path):
    train(feature_dir, tmp_path / "lr0", target, dataclasses.replace(FAST, lr=0.0, steps=1), progress=False)
    return tmp_path / "lr0" / "head"


def test_the_trained_head_through_the_executor_computes_what_training_computed(tmp_path, feature_dir, target, checkpoint):
    """Entry i reads (the features at i, embedding of t_{i+1}): the trainer's step-1 logits
    equal the inference head's fed the shards' features."""
    train(feature_dir, tmp_path, target, dataclasses.replace(FAST, unroll=1), progress=False)
    _, shards = load_shards(feature_dir)
    refs = sequence_refs(shards)
    ref = refs[2]
    batch = build_batch(shards, refs, [2], max_entries=1000, regress=False)
    tokens = shards[ref.shard]["tokens"][ref.start : ref.start + ref.length].tolist()

    executor = Executor(build_runner(checkpoint, ModelConfig(model="tiny")), lambda: checkpoint_sha256(checkpoint))
    executor.add_model(ModelSpec("head", ModelConfig(model=str(tmp_path / "head")), head_of=TARGET))
    executor.allocate_kv(64, 4)
    features = executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, list(range(16)), logits="none")])).hidden  # exposed for the head
    head_in = SeqInput(tokens[1:], 0, list(range(16, 32)), logits="all")
    got = executor.run(ForwardPlan("head", [head_in], hidden_states=features[:-1].bfloat16().float())).logits

    head = load_head(tmp_path / "head")
    weights = {k: v for k, v in head.weights.items() if k != "vocab_map"}
    model = HeadObjective(target.arch, "eagle3", weights, target.embed, target.lm_head, head.weights["vocab_map"])
    torch.testing.assert_close(got[:, head.weights["vocab_map"]], model.logits_of(batch), atol=2e-4, rtol=1e-4)


def test_bad_options_are_refused_by_name(target):
    with pytest.raises(ValueError, match="feature_layers: only the eagle3 variant reads feature layers"):
        TrainOptions(variant="normed", feature_layers=(0, 1, 1))
    with pytest.raises(ValueError, match="feature_layers: an eagle3 head reads 3 target layers"):
        TrainOptions(variant="eagle3", feature_layers=(0, 1))
    with pytest.raises(ValueError, match=r"feature_layers: the target has layers 0..1, got \[0, 1, 2\]"):
        TrainOptions(variant="eagle3", feature_layers=(0, 1, 2)).layers_read(target.arch.num_layers)
    assert TrainOptions(variant="eagle3").layers_read(2) == (1, 1, 0)  # the default, brought into a tiny target
    assert TrainOptions(variant="eagle3", hidden_weight=0.5).regression_weight == 0.0  # no feature regression
