"""Head training: the loss falls on a toy set until the head matches the target, resume continues
bit for bit, the shared tensors stay frozen, two DDP processes equal one, and the trained head is
what the inference head computes on the same (shifted) inputs."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import save_file

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan, ModelSpec
from speculant.loader.errors import CheckpointError
from speculant.loader.head_file import checkpoint_sha256, load_head
from speculant.training.batches import BatchPlan, build_batch, sequence_refs, trained_entries
from speculant.training.curves import read_curve
from speculant.training.hidden import (
    COUNTS,
    load_counts,
    load_shards,
)
from speculant.training.trainer import (
    CURVE,
    TrainOptions,
    lr_at,
    reduced_vocab,
    split_heldout,
    train,
)

FAST = TrainOptions(steps=6, batch_tokens=64, lr=3e-3, warmup_steps=2, checkpoint_every=2, draft_vocab=120, unroll=2)


def _head(folder):
    return load_head(folder / "head").weights


def test_loss_falls_until_the_head_matches_the_target(tmp_path, hidden_dir, target):
    options = TrainOptions(steps=200, lr=3e-2, warmup_steps=5, batch_tokens=512, hidden_weight=0.0, checkpoint_every=200)
    train(hidden_dir, tmp_path, target, options, progress=False)
    rows = read_curve(tmp_path / CURVE)
    first, last = float(rows[0]["kl_1"]), float(rows[-1]["kl_1"])  # KL(target || head) per entry
    assert last < 0.05 * first
    assert float(rows[-1]["acc_1"]) > 0.85  # the head's top token is mostly the target's
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_resume_continues_bit_for_bit(tmp_path, hidden_dir, target):
    train(hidden_dir, tmp_path / "straight", target, FAST, progress=False)
    train(hidden_dir, tmp_path / "resumed", target, FAST, progress=False, stop_after=3)
    train(hidden_dir, tmp_path / "resumed", target, FAST, progress=False)
    a, b = _head(tmp_path / "straight"), _head(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    drop_time = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert drop_time(read_curve(tmp_path / "straight" / CURVE)) == drop_time(read_curve(tmp_path / "resumed" / CURVE))


def test_changed_options_refuse_to_resume(tmp_path, hidden_dir, target):
    train(hidden_dir, tmp_path, target, FAST, progress=False, stop_after=2)
    with pytest.raises(ValueError, match="other training options.*lr"):
        train(hidden_dir, tmp_path, target, dataclasses.replace(FAST, lr=1.0), progress=False)


def test_a_bfloat16_head_file_is_the_fp32_head_rounded(tmp_path, hidden_dir, target):
    train(hidden_dir, tmp_path / "fp32", target, FAST, progress=False)
    train(hidden_dir, tmp_path / "bf16", target, FAST, progress=False, stop_after=3)
    train(hidden_dir, tmp_path / "bf16", target, dataclasses.replace(FAST, head_dtype="bfloat16"), progress=False)  # resumes
    a, b = _head(tmp_path / "fp32"), _head(tmp_path / "bf16")
    assert a.keys() == b.keys() and torch.equal(a["vocab_map"], b["vocab_map"])
    assert all(b[k].dtype == torch.bfloat16 and torch.equal(a[k].bfloat16(), b[k]) for k in a if k != "vocab_map")
    with pytest.raises(ValueError, match="head_dtype"):
        TrainOptions(head_dtype="float16")


def test_shared_tensors_stay_frozen_and_out_of_the_head_file(tmp_path, hidden_dir, target, checkpoint):
    embed_before = target.embed.clone()
    train(hidden_dir, tmp_path, target, FAST, progress=False)
    assert torch.equal(target.embed, embed_before) and not target.embed.requires_grad
    assert target.embed.data_ptr() == checkpoint.weights["model.embed_tokens.weight"].data_ptr()  # not a copy
    head = load_head(tmp_path / "head", expect_sha256=checkpoint_sha256(checkpoint))
    assert not any("embed" in k or "lm_head" in k for k in head.weights)
    assert head.config.draft_vocab_size == 120 and head.weights["vocab_map"].numel() == 120
    assert head.config.training["unroll"] == 2 and head.config.target == "tiny"
    with pytest.raises(CheckpointError, match="trained for target 'tiny'"):
        load_head(tmp_path / "head", expect_sha256="0" * 64)


def _ddp_worker(rank: int, world: int, rendezvous: str, hidden_dir, out_dir, target, options) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        train(hidden_dir, out_dir, target, options, progress=False)
    finally:
        dist.destroy_process_group()


def test_two_ddp_processes_equal_one(tmp_path, hidden_dir, target):
    options = dataclasses.replace(FAST, steps=4, batch_tokens=96)
    assert any(len(BatchPlan(sequence_refs(load_shards(hidden_dir)[1]), 96, 0).step(s)) % 2 for s in range(4))  # an uneven split
    train(hidden_dir, tmp_path / "one", target, options, progress=False)
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "rdv"), hidden_dir, tmp_path / "two", target, options), nprocs=2)
    a, b = _head(tmp_path / "one"), _head(tmp_path / "two")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    assert float(read_curve(tmp_path / "one" / CURVE)[-1]["ce_1"]) == pytest.approx(float(read_curve(tmp_path / "two" / CURVE)[-1]["ce_1"]), rel=1e-4)


def test_trained_head_equals_the_inference_head_on_shifted_inputs(tmp_path, hidden_dir, target, checkpoint):
    """Entry i reads (h_i, embedding of t_{i+1}): the trainer's logits on a sequence equal the
    inference head's (`DraftHead` through the executor) fed the target's states shifted by one."""
    train(hidden_dir, tmp_path, target, dataclasses.replace(FAST, unroll=1), progress=False)
    _, shards = load_shards(hidden_dir)
    refs = sequence_refs(shards)
    batch = build_batch(shards, refs, [2], max_entries=1000)
    tokens = shards[refs[2].shard]["tokens"][refs[2].start : refs[2].start + refs[2].length].tolist()

    config = ModelConfig(model="tiny")
    executor = Executor(build_runner(checkpoint, config), lambda: checkpoint_sha256(checkpoint))
    executor.add_model(ModelSpec("head", ModelConfig(model=str(tmp_path / "head")), head_of=TARGET))
    executor.allocate_kv(64, 4)
    hidden = executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, list(range(16)), logits="none")])).hidden
    head_in = SeqInput(tokens[1:], 0, list(range(16, 32)), logits="all")
    shards_hidden = hidden[:-1].bfloat16().float()  # the precision the shards keep
    got = executor.run(ForwardPlan("head", [head_in], hidden_states=shards_hidden)).logits  # [L-1, vocab]

    model = _trained_objective(tmp_path, target, checkpoint)
    expected = model.logits_of(batch)  # [L-1, draft vocab]
    vocab_map = model.vocab_map
    torch.testing.assert_close(got[:, vocab_map], expected, atol=2e-4, rtol=1e-4)
    outside = torch.ones(got.shape[1], dtype=torch.bool)
    outside[vocab_map] = False
    assert torch.isinf(got[:, outside]).all()


def _trained_objective(folder, target, checkpoint):
    from speculant.training.objective import HeadObjective

    head = load_head(folder / "head")
    weights = {k: v for k, v in head.weights.items() if k != "vocab_map"}
    return HeadObjective(target.arch, head.config.variant, weights, target.embed, target.lm_head, head.weights["vocab_map"])


def test_trained_entries_match_the_step_masks(hidden_dir):
    _, shards = load_shards(hidden_dir)
    refs = sequence_refs(shards)
    batch = build_batch(shards, refs, list(range(len(refs))), max_entries=20)
    for step in (1, 2, 3):
        assert int(batch.step_mask(step).sum()) == sum(trained_entries(r, step, 20) for r in refs)


def test_learning_rate_schedule_and_reduced_vocabulary():
    o = TrainOptions(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, o) == pytest.approx(0.1) and lr_at(9, o) == pytest.approx(1.0)
    assert lr_at(99, o) == pytest.approx(0.1, abs=1e-3) and lr_at(55, o) < lr_at(20, o)
    counts = torch.tensor([0, 5, 3, 5, 1, 9])
    assert reduced_vocab(counts, 3).tolist() == [1, 3, 5]  # ties go to the lower id
    assert reduced_vocab(counts, 0) is None and reduced_vocab(counts, 6) is None


def test_heldout_conversations_are_scored_at_checkpoints_and_never_trained(tmp_path, hidden_dir, target):
    _, shards = load_shards(hidden_dir)
    refs = sequence_refs(shards)
    kept, held = split_heldout(refs, 2, seed=0)
    assert len(held) == 2 and len(kept) == len(refs) - 2 and not set(held) & set(kept)
    assert split_heldout(refs, 2, seed=0) == (kept, held)
    options = dataclasses.replace(FAST, heldout=2)
    train(hidden_dir, tmp_path, target, options, progress=False)
    rows = read_curve(tmp_path / CURVE)
    scored = [int(r["step"]) for r in rows if r["val_acc_1"] != ""]
    assert scored == [2, 4, 6]  # every checkpoint
    assert all(0.0 <= float(r["val_acc_1"]) <= 1.0 and float(r["val_kl_1"]) >= 0.0 for r in rows if r["val_acc_1"])
    with pytest.raises(ValueError, match="heldout"):
        split_heldout(refs, len(refs), seed=0)


def test_init_layer_starts_the_block_as_the_targets_layer(tmp_path, hidden_dir, target, checkpoint):
    options = TrainOptions(steps=1, lr=0.0, warmup_steps=1, init_layer=1, draft_vocab=120)
    train(hidden_dir, tmp_path, target, options, progress=False)
    head = _head(tmp_path)
    layer = target.layer(1)
    assert layer and all(torch.equal(head[k], v) for k, v in layer.items())
    eye = torch.eye(target.arch.hidden_size)
    assert torch.equal(head["eh_proj.weight"], torch.cat([eye, eye], dim=1) / 2)
    assert torch.equal(layer["layer.mlp.down_proj.weight"], checkpoint.weights["model.layers.1.mlp.down_proj.weight"].float())
    with pytest.raises(ValueError, match="init_layer"):
        target.layer(target.arch.num_layers)
    with pytest.raises(ValueError, match="init_layer"):
        TrainOptions(init_layer=-2)


def test_init_head_starts_from_a_trained_heads_weights(tmp_path, hidden_dir, target):
    train(hidden_dir, tmp_path / "first", target, dataclasses.replace(FAST, unroll=1), progress=False)
    first = tmp_path / "first" / "head"
    again = TrainOptions(steps=1, lr=0.0, warmup_steps=1, draft_vocab=120, unroll=2, init_head=str(first))
    train(hidden_dir, tmp_path / "second", target, again, progress=False)
    a, b = _head(tmp_path / "first"), _head(tmp_path / "second")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # lr 0: the start, saved
    for changed, what in (({"draft_vocab": 100}, "draft_vocab: init_head"), ({"variant": "eagle"}, "normed head")):
        with pytest.raises(ValueError, match=what):
            train(hidden_dir, tmp_path / what[:5], target, dataclasses.replace(again, **changed), progress=False)
    with pytest.raises(ValueError, match="init_head and init_layer"):
        TrainOptions(init_head=str(first), init_layer=0)


def test_init_head_keeps_its_draft_vocabulary_over_grown_data(tmp_path, hidden_dir, target):
    train(hidden_dir, tmp_path / "first", target, dataclasses.replace(FAST, unroll=1), progress=False)
    first = _head(tmp_path / "first")
    grown = tmp_path / "grown"
    shutil.copytree(hidden_dir, grown)
    counts = torch.arange(load_counts(grown).numel())  # the data's most frequent tokens are now the highest ids
    save_file({"counts": counts}, str(grown / COUNTS))
    assert not torch.equal(reduced_vocab(counts, 120), first["vocab_map"])
    again = TrainOptions(steps=1, lr=0.0, warmup_steps=1, draft_vocab=120, init_head=str(tmp_path / "first" / "head"))
    train(grown, tmp_path / "second", target, again, progress=False)
    assert torch.equal(_head(tmp_path / "second")["vocab_map"], first["vocab_map"])
