"""Hidden-state shards: what they hold equals the target's own forward (checked against
transformers), an interrupted precompute resumes to the same files, appended conversations extend
them, token counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from speculant.config import ModelConfig
from speculant.training.hidden import (
    HiddenOptions,
    Sequence,
    count_tokens,
    load_counts,
    load_shards,
    precompute,
    sequences_from_responses,
)

OPTIONS = HiddenOptions(top_k=8, max_seq_len=64, forward_tokens=60, shard_tokens=50, page_size=4)


def _sequences(n: int = 9, vocab: int = 256, seed: int = 0) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 30, (n,), generator=g).tolist()
    return [Sequence(torch.randint(3, vocab, (L,), generator=g).tolist(), prompt_len=3) for L in lengths]


def test_shards_hold_the_targets_hidden_states_and_distribution(tmp_path, hf_model, checkpoint):
    sequences = _sequences()
    precompute(checkpoint, ModelConfig(model="tiny"), sequences, tmp_path, OPTIONS, progress=False)
    manifest, shards = load_shards(tmp_path)
    assert len(shards) > 1 and sum(s["num_seqs"] for s in manifest["shards"]) == len(sequences)
    rows = [(shard, b) for shard in shards for b in range(len(shard["prompt_lens"]))]
    for seq, (shard, b) in zip(sequences, rows):
        lo, hi = shard["cu_seqlens"][b].item(), shard["cu_seqlens"][b + 1].item()
        assert shard["tokens"][lo:hi].tolist() == seq.tokens
        with torch.no_grad():
            ref = hf_model(torch.tensor([seq.tokens]), output_hidden_states=True)
        ref_logprobs = F.log_softmax(ref.logits[0].float(), dim=-1)  # [L, vocab]
        top = ref_logprobs.topk(OPTIONS.top_k, dim=-1)
        assert torch.equal(shard["topk_ids"][lo:hi, 0].long(), top.indices[:, 0])
        torch.testing.assert_close(shard["topk_logprobs"][lo:hi].float(), top.values, atol=2e-2, rtol=1e-2)
        # transformers' last hidden state is after the final norm; ours is before it.
        ours = hf_model.model.norm(shard["hidden"][lo:hi].float())
        torch.testing.assert_close(ours, ref.hidden_states[-1][0], atol=5e-2, rtol=2e-2)


def test_interrupted_precompute_resumes_to_the_same_shards(tmp_path, checkpoint):
    sequences, config = _sequences(), ModelConfig(model="tiny")
    precompute(checkpoint, config, sequences, tmp_path / "whole", OPTIONS, progress=False)
    cut = tmp_path / "cut"
    partial = precompute(checkpoint, config, sequences, cut, OPTIONS, progress=False, stop_after_shards=1)
    assert len(partial["shards"]) == 1 and not partial["complete"]
    (cut / "shard-00001.safetensors.tmp").write_bytes(b"torn")  # a shard write the kill cut short
    precompute(checkpoint, config, sequences, cut, OPTIONS, progress=False)
    whole_manifest, whole = load_shards(tmp_path / "whole")
    cut_manifest, resumed = load_shards(cut)
    assert cut_manifest["shards"] == whole_manifest["shards"]
    for a, b in zip(whole, resumed):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(load_counts(cut), load_counts(tmp_path / "whole"))


def test_appended_conversations_extend_the_shards(tmp_path, checkpoint):
    sequences, config = _sequences(), ModelConfig(model="tiny")
    precompute(checkpoint, config, sequences, tmp_path / "whole", OPTIONS, progress=False)
    grown = tmp_path / "grown"
    precompute(checkpoint, config, sequences[:5], grown, OPTIONS, progress=False)
    first_shards = load_shards(grown)[0]["shards"]
    manifest = precompute(checkpoint, config, sequences, grown, OPTIONS, progress=False)
    assert manifest["complete"] and manifest["shards"][: len(first_shards)] == first_shards
    whole, extended = load_shards(tmp_path / "whole")[1], load_shards(grown)[1]
    for key in ("tokens", "hidden", "topk_ids", "topk_logprobs"):  # the same rows, other shard cuts
        assert torch.equal(torch.cat([s[key] for s in whole]), torch.cat([s[key] for s in extended])), key
    assert torch.equal(load_counts(grown), load_counts(tmp_path / "whole"))
    other = [Sequence([7] * 8, prompt_len=3)] + sequences[1:]
    with pytest.raises(ValueError, match="conversation 0 differs"):
        precompute(checkpoint, config, other + sequences[:2], grown, OPTIONS, progress=False)
    with pytest.raises(ValueError, match="holds 9 conversations, this run has 8"):
        precompute(checkpoint, config, sequences[:8], grown, OPTIONS, progress=False)


def test_changed_settings_are_refused(tmp_path, checkpoint):
    sequences, config = _sequences(), ModelConfig(model="tiny")
    precompute(checkpoint, config, sequences, tmp_path, OPTIONS, progress=False, stop_after_shards=1)
    with pytest.raises(ValueError, match="made with other settings.*top_k"):
        precompute(checkpoint, config, sequences, tmp_path, dataclasses.replace(OPTIONS, top_k=4), progress=False)


def test_token_counts_cover_responses_only():
    seqs = [Sequence([5, 5, 7, 9, 9, 9], prompt_len=2), Sequence([9, 1, 7], prompt_len=1)]
    counts = count_tokens(seqs, vocab_size=12)
    assert counts.tolist() == [0, 1, 0, 0, 0, 0, 0, 2, 0, 3, 0, 0]


def test_sequences_from_responses_cut_and_skip():
    rows = [
        {"prompt_ids": [1, 2], "response_ids": [3, 4, 5]},
        {"prompt_ids": [1, 2], "response_ids": []},  # nothing to learn
        {"prompt_ids": [1] * 9, "response_ids": [3]},  # the prompt fills the window
    ]
    assert sequences_from_responses(rows, max_seq_len=4) == [Sequence([1, 2, 3, 4], 2)]


def test_shard_files_are_safetensors_with_documented_layout(tmp_path, checkpoint):
    precompute(checkpoint, ModelConfig(model="tiny"), _sequences(3), tmp_path, OPTIONS, progress=False)
    shard = load_file(str(tmp_path / "shard-00000.safetensors"))
    T = int(shard["cu_seqlens"][-1])
    assert shard["hidden"].dtype == torch.bfloat16 and shard["hidden"].shape == (T, 64)
    assert shard["topk_ids"].dtype == torch.int32 and shard["topk_ids"].shape == (T, 8)
    assert shard["topk_logprobs"].dtype == torch.float16 and shard["tokens"].dtype == torch.int32
