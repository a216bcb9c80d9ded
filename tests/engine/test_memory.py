"""The memory plan: it matches the process's measured memory, a memory budget sizes the KV
cache from what the plan leaves, and a budget too small fails at construction."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.config import (
    CacheConfig,
    DraftModelConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from speculant.engine import memory
from speculant.engine.engine import Engine
from speculant.llm import LLM
from speculant.sampling.params import SamplingParams

MIB = 1 << 20
TESTS = Path(__file__).resolve().parents[1]


@functools.cache
def _target():
    return tiny_hf_model("llama", seed=3)


@functools.cache
def _draft():
    return tiny_hf_model("llama", seed=4, hidden_size=32, num_hidden_layers=1)


def _config(method: str = "draft", draft_sampling: str = "greedy", **cache) -> EngineConfig:
    draft = DraftModelConfig(model="tiny-draft", sampling=draft_sampling)
    return EngineConfig(
        model=ModelConfig(model="tiny"),
        cache=CacheConfig(page_size=4, **cache),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
        speculative=SpeculativeConfig(method=method, num_draft_tokens=3, draft=draft),
    )


def _engine(config: EngineConfig) -> Engine:
    draft = TinyCheckpoint(_draft()) if config.speculative.method == "draft" else None
    return Engine(config, checkpoint=TinyCheckpoint(_target()), draft_checkpoint=draft)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_plan_matches_measured_process_memory(method):
    """Peak RSS growth across engine construction, full-batch speculative steps (sampled
    rows with top-k/top-p/min-p, sampled drafts) and a full K/V cache, in a fresh interpreter, is within 10% of the
    plan's total."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        "MALLOC_MMAP_THRESHOLD_": "65536",  # big buffers are mapped and unmapped, none kept in the heap
        "MALLOC_ARENA_MAX": "2",
        # one fixed kernel, so no start-up kernel timing runs inside the measured window; oneDNN's
        # pre-packed copy of every weight is the largest a kernel choice keeps, and the plan counts it
        "SPECULANT_LINEAR_KERNEL": "onednn",
    }
    probe = Path(__file__).with_name("memory_probe.py")
    done = subprocess.run([sys.executable, str(probe), method], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    planned, measured = result["planned"], result["measured"]
    items = ", ".join(f"{k} {v / MIB:.1f}" for k, v in result["plan"].items())
    message = f"{method}: measured {measured / MIB:.1f} MiB, planned {planned / MIB:.1f} MiB ({items})"
    assert planned > 200 * MIB, message  # the plan, not noise, dominates
    assert result["draft_tokens"] > 0, message
    assert abs(measured - planned) <= 0.1 * planned, message


def test_memory_budget_sizes_kv_from_what_the_plan_leaves():
    budget = 24 * MIB
    engine = _engine(_config(memory_budget=budget, kv_cache_bytes=1 << 40))  # kv_cache_bytes is ignored
    plan = engine.memory
    per_page = plan.kv_cache // plan.num_pages
    assert plan.total <= budget < plan.total + per_page
    assert engine.num_pages == plan.num_pages
    assert plan.as_dict()["total"] == sum(v for k, v in plan.as_dict().items() if k != "total")


def test_memory_budget_fraction_of_free_memory(monkeypatch):
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: 64 * MIB)
    plan = _engine(_config(memory_budget=0.5)).memory
    assert 32 * MIB - plan.kv_cache // plan.num_pages < plan.total <= 32 * MIB


def test_too_small_budget_fails_at_construction_naming_what_it_must_cover():
    with pytest.raises(ValueError, match=r"memory_budget of 1\.0 MiB is too small: it must cover .* MiB for weights "
                       r"and workspaces \(.*target_weights.*\) plus .* MiB of KV cache for one full-context sequence"):
        _engine(_config(memory_budget=MIB))


def test_num_pages_wins_but_must_fit_a_budget_beside_it():
    assert _engine(_config(num_pages=50, memory_budget=0.9)).num_pages == 50
    with pytest.raises(ValueError, match=r"memory_budget of 4\.0 MiB is too small for the plan's"):
        _engine(_config(num_pages=4096, memory_budget=4 * MIB))


def test_without_a_budget_kv_cache_bytes_sizes_the_kv():
    plan = _engine(_config(kv_cache_bytes=MIB)).memory
    assert plan.kv_cache <= MIB < plan.kv_cache + plan.kv_cache // plan.num_pages


def test_plan_items_follow_the_configuration():
    draft = _engine(_config()).memory
    ngram = _engine(_config("ngram")).memory
    vocab, batch, k = 256, 8, 3
    assert ngram.draft_weights == ngram.draft_logits == ngram.draft_probs == 0
    assert draft.draft_weights > 0 and draft.draft_logits == batch * vocab * 4
    assert draft.draft_probs == 0  # greedy drafts are one-hot: no probabilities kept
    assert draft.verify == ngram.verify == 2 * batch * (k + 1) * vocab * 4
    assert _engine(_config(draft_sampling="sample")).memory.draft_probs == batch * k * vocab * 4


def test_weights_are_the_loaded_tensors_counted_once():
    tied = tiny_hf_model("tied")
    engine = Engine(_config("none"), checkpoint=TinyCheckpoint(tied))
    params = sum(p.numel() for p in tied.parameters()) * 4  # tied: embedding and lm_head are one
    rotary = 2 * tied.config.max_position_embeddings * (tied.config.hidden_size // 4) * 4  # cos, sin
    assert engine.memory.target_weights == params + rotary


def test_stats_report_the_plan():
    llm = LLM(config=_config(), checkpoint=TinyCheckpoint(_target()), draft_checkpoint=TinyCheckpoint(_draft()))
    stats = llm.stats()["memory"]
    assert stats == llm.engine.memory.as_dict()
    assert set(stats) >= {"target_weights", "draft_weights", "kv_cache", "verify", "attention", "total"}


def test_request_k_above_the_engines_is_cut_to_it():
    """The verify workspace is planned at the engine's k; a request may ask for less, not more."""
    engine = _engine(_config())
    request = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, num_draft_tokens=9))
    assert engine.proposer.num_draft_tokens(request) == 3


def test_carried_draft_logits_hold_one_row_each():
    config = _config()  # fixed k: the draft follows every request from its prompt on (adaptive k feeds it lazily)
    engine = _engine(dataclasses.replace(config, speculative=dataclasses.replace(config.speculative, adaptive_k=False)))
    for b in range(5):
        engine.add_request([5 + b, 6, 7, 8], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    carried = engine.proposer.carried
    assert len(carried) == 5
    assert all(t.untyped_storage().nbytes() == 256 * 4 for t in carried.values())


def test_generate_verbose_prints_the_plan_at_start_up(monkeypatch, capsys):
    import speculant.llm
    from speculant.cli import main

    monkeypatch.setattr(speculant.llm, "LLM", lambda config: LLM(config=config, checkpoint=TinyCheckpoint(_target())))
    main(["generate", "--model", "tiny", "--prompt", "hi", "--verbose", "--memory-budget", str(256 * MIB)])
    err = capsys.readouterr().err  # the tiny model has no tokenizer: the plan is printed before that error
    assert "memory plan (" in err and "target_weights" in err
    assert "256.0 MiB" in err.split("total")[1].splitlines()[0]


def test_mla_pages_hold_the_latent_of_every_layer_and_the_mtp_head():
    """A DeepSeek-V3 target with its own MTP layer as the head: a page holds, per token, one latent
    row [kv_lora_rank + qk_rope_head_dim] for each target layer and for the head's layer."""
    from testkit import with_mtp_layer

    hf = tiny_hf_model("deepseek", seed=3)
    config = _config("mtp", num_pages=32)
    plan = Engine(config, checkpoint=with_mtp_layer(hf)).memory
    c = hf.config
    per_token = (c.num_hidden_layers + 1) * (c.kv_lora_rank + c.qk_rope_head_dim) * 4
    assert plan.kv_cache == 32 * 4 * per_token
    assert plan.attention > 0 and plan.activations > 0
