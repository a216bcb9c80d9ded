"""A head trained by `speculant train-head` for a DeepSeek-V3 target: its block is the target
family's MTP block (MLA + MoE), training computes what the inference head computes, and MTP
speculation with it is lossless (greedy equality; the statistical sampling test)."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_hf_model

from speculant import LLM, SamplingParams
from speculant.attention.batch import SeqInput
from speculant.cli import main
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan, ModelSpec
from speculant.loader import load_checkpoint
from speculant.loader.head_file import checkpoint_sha256, load_head
from speculant.models.head import head_weight_shapes
from speculant.training.batches import Batch
from speculant.training.objective import HeadObjective
from speculant.training.target import target_tensors

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
BYTE_VOCAB = 260  # the byte tokenizer of conftest.py


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory, tokenizer):
    """A tiny DeepSeek-V3 (MLA with q LoRA, dense then MoE layers, YaRN) as a model folder."""
    folder = tmp_path_factory.mktemp("deepseek")
    tiny_hf_model("deepseek", seed=8, vocab_size=BYTE_VOCAB).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def deepseek(deepseek_dir):
    return load_checkpoint(str(deepseek_dir))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, deepseek_dir):
    """`speculant train-head` end to end on the folder (self-distilled responses, unroll 2)."""
    folder, out = deepseek_dir, tmp_path_factory.mktemp("run")
    data = out / "prompts.jsonl"
    data.write_text("".join(f'{{"prompt": "count {i} to {i + 9}"}}\n' for i in range(8)))
    args = [
        "train-head", "--model", str(folder), "--data", str(data), "--out", str(out / "run"),
        "--max-new-tokens", "12", "--gen-batch", "8", "--steps", "40", "--batch-tokens", "128",
        "--lr", "3e-3", "--warmup-steps", "2", "--unroll", "2", "--draft-vocab", "120", "--no-progress",
    ]
    assert main(args) == 0
    return out / "run" / "train" / "head"


def test_the_head_is_the_families_mtp_block(trained, deepseek):
    head = load_head(trained)
    shapes = head_weight_shapes(deepseek.arch, "normed")
    assert {k: tuple(v.shape) for k, v in head.weights.items() if k != "vocab_map"} == shapes
    assert "layer.self_attn.kv_b_proj.weight" in shapes and "layer.mlp.experts.gate_up_proj" in shapes
    assert head.config.target_sha256 == checkpoint_sha256(deepseek)


def test_training_computes_what_the_inference_head_computes(trained, deepseek):
    """The trainer's block (MLA expanded through a masked SDPA, the MoE on trainable tensors)
    against the inference head (the target family's block, absorbed MLA over the paged cache)."""
    head = load_head(trained)
    target = target_tensors(deepseek, "tiny")
    weights = {k: v for k, v in head.weights.items() if k != "vocab_map"}
    model = HeadObjective(target.arch, "normed", weights, target.embed, target.lm_head, head.weights["vocab_map"])
    tokens = list(range(40, 62))
    executor = Executor(build_runner(deepseek, ModelConfig(model="tiny")), lambda: checkpoint_sha256(deepseek))
    executor.add_model(ModelSpec("head", ModelConfig(model=str(trained)), head_of=TARGET))
    executor.allocate_kv(64, 4)
    hidden = executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, list(range(8)), logits="none")])).hidden
    got = executor.run(ForwardPlan("head", [SeqInput(tokens[1:], 0, list(range(8, 16)), logits="all")], hidden_states=hidden[:-1])).logits
    expected = model.logits_of(_one_sequence(tokens, hidden))
    torch.testing.assert_close(got[:, model.vocab_map], expected, atol=2e-4, rtol=1e-4)


def _one_sequence(tokens: list[int], hidden: torch.Tensor) -> Batch:
    """Entries 0..L-2 of one sequence: (h_i, t_{i+1}); labels unused by `logits_of`."""
    n = len(tokens) - 1
    zeros, count = torch.zeros(n, dtype=torch.int64), torch.full((n,), len(tokens))
    return Batch(
        seq_ids=zeros, local=torch.arange(n), prompt_lens=zeros, lengths=count, hidden_in=hidden[:-1],
        embed_ids=torch.tensor(tokens[1:]), label_ids=zeros[:, None], label_logprobs=torch.zeros(n, 1),
        hidden_next=hidden[1:],
    )


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_mtp_with_the_trained_head_equals_plain(trained, deepseek_dir, k):
    prompts = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], list(range(50, 61))]
    llm = lambda **o: LLM(model=str(deepseek_dir), page_size=4, num_pages=256, adaptive_k=False, **o)  # noqa: E731
    plain = [o.token_ids for o in llm().generate(prompts, GREEDY)]
    spec = llm(speculative="mtp", head=str(trained), num_draft_tokens=k, max_num_batched_tokens=16)
    assert [o.token_ids for o in spec.generate(prompts, GREEDY)] == plain
    assert spec.stats()["accepted_tokens"] > 0
