"""Measure process memory across engine construction, a full-batch speculative step and a full
K/V cache, next to the engine's memory plan. Run in a fresh interpreter by test_memory.py; prints one JSON line.

usage: memory_probe.py draft|ngram
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys

import torch
import torch.nn.functional as F
from testkit import TinyCheckpoint, resident_bytes, tiny_hf_model

from speculant.config import (
    CacheConfig,
    DraftModelConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from speculant.engine.engine import Engine
from speculant.sampling.params import SamplingParams

BATCH, K, PAGE = 16, 4, 16
BUDGET = 360 << 20
TARGET = dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
DRAFT = dict(TARGET, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_key_value_heads=1)


def checkpoint(**arch) -> TinyCheckpoint:
    """Half-precision checkpoint tensors, so that loading them at float32 copies every one."""
    ckpt = TinyCheckpoint(tiny_hf_model(**arch))
    ckpt.weights = {name: w.half() for name, w in ckpt.weights.items()}
    return ckpt


def peak_resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def warm_up() -> None:
    """Thread pools and kernels' first-use buffers, before the baseline."""
    a = torch.randn(64, 256)
    (a @ a.T).softmax(-1).sort(-1)
    q = torch.randn(2, 4, 8, 64)
    kv = torch.randn(2, 2, 32, 64)
    F.scaled_dot_product_attention(q, kv, kv, attn_mask=torch.ones(2, 1, 8, 32, dtype=torch.bool), enable_gqa=True)


def config(method: str) -> EngineConfig:
    draft = DraftModelConfig(model="tiny-draft", sampling="sample")
    return EngineConfig(
        model=ModelConfig(model="tiny"),
        cache=CacheConfig(page_size=PAGE, memory_budget=BUDGET),
        scheduler=SchedulerConfig(max_num_seqs=BATCH, max_num_batched_tokens=64),
        speculative=SpeculativeConfig(method=method, num_draft_tokens=K, adaptive_k=False, draft=draft),  # every step at k
    )


def params(b: int, method: str) -> SamplingParams:
    """Sampled rows with every truncation (the sampler's costliest path), and greedy rows."""
    if b % 2 and method == "draft":
        return SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    return SamplingParams(max_tokens=64, temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, ignore_eos=True)


def run(method: str) -> dict:
    target = checkpoint(**TARGET)
    if method == "ngram":
        # Equal logits: sampling draws among the ids 0..49 (top-k, then top-p), all of which the
        # prompt holds, so the n-gram proposer finds every sequence's last token and drafts k.
        target.weights["model.norm.weight"].zero_()
    draft = checkpoint(**DRAFT) if method == "draft" else None
    warm_up()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    baseline = resident_bytes()
    reset_peak()
    engine = Engine(config(method), checkpoint=target, draft_checkpoint=draft)
    constructed = resident_bytes() - baseline
    for name in engine.executor.model_names:  # a full cache: on the CPU pages are committed when first written
        kv = engine.executor.runner(name).kv
        kv.k.fill_(0.0)
        kv.v.fill_(0.0)
    for b in range(BATCH):
        engine.add_request([*range(50), 4000 + b], params(b, method))
    full_steps = 0
    while full_steps < 2:  # every request drafting in the same step
        before = engine.stats.spec_stats.draft_steps
        engine.step()
        full_steps += engine.stats.spec_stats.draft_steps - before == BATCH
    return {
        "planned": engine.memory.total,
        "measured": peak_resident_bytes() - baseline,
        "constructed": constructed,
        "plan": engine.memory.as_dict(),
        "draft_tokens": engine.stats.spec_stats.draft_tokens,
    }


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
