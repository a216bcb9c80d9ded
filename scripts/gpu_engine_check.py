"""Whole engine steps on CUDA under `torch.cuda.set_sync_debug_mode("error")`, outside the one
sanctioned read (`speculant.utils.sync.read_all`), then a short timing with overlap off and on.

    PYTHONPATH=.:tests python3 scripts/gpu_engine_check.py

Tiny random models (tests/testkit.py), so it needs no downloaded weights: it checks that a step
syncs only once, not how fast a real model runs. Prints one line per method and exits non-zero on
a hidden sync.
"""

from __future__ import annotations

import sys
import time

import torch
from testkit import MIXED_PROMPTS, noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.utils import sync

METHODS = {
    "plain": {},
    "ngram": {"speculative": "ngram"},
    "draft": {"speculative": "draft", "num_draft_tokens": 3},
    "draft-sampled": {"speculative": "draft", "num_draft_tokens": 3, "draft_sampling": "sample"},
}
PARAMS = [SamplingParams(max_tokens=32, temperature=0), SamplingParams(max_tokens=32, temperature=0.8, seed=5, logprobs=True)]


def llm_for(method: str, target, draft, **options):
    kwargs = {**METHODS[method], **options, "device": "cuda"}
    return tiny_llm(target, draft if kwargs.get("speculative") == "draft" else None, **kwargs)


def checked_decode_steps(method: str, target, draft) -> int:
    """Decode steps run under sync debug mode "error"; returns the host reads per step."""
    llm = llm_for(method, target, draft)
    for i, prompt in enumerate(MIXED_PROMPTS[:8]):
        llm.engine.add_request(prompt, PARAMS[i % 2])
    while not all(r.output_token_ids for r in llm.engine.requests.values()):
        llm.engine.step()
    reads = sync.host_reads()
    steps = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        with sync.counting_cpu_reads():
            while llm.engine.has_unfinished() and steps < 8:
                llm.engine.step()
                steps += 1
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return (sync.host_reads() - reads) / max(steps, 1)


def tokens_per_s(method: str, target, draft, overlap: bool, batch: int) -> float:
    llm = llm_for(method, target, draft, overlap=overlap)
    prompts = (MIXED_PROMPTS * 4)[:batch]
    llm.generate(prompts[:1], PARAMS[0])  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, PARAMS[0])
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA"
    target = tiny_hf_model("llama")
    draft = noisy_copy(target)
    failed = False
    for method in METHODS:
        try:
            print(f"{method:>14}: {checked_decode_steps(method, target, draft):.2f} host reads per decode step, no hidden sync")
        except RuntimeError as exc:  # set_sync_debug_mode("error") raises on a synchronizing op
            failed = True
            print(f"{method:>14}: HIDDEN SYNC: {exc}")
    print(f"\n{'method':>14} {'batch':>5} {'serial tok/s':>12} {'overlap tok/s':>13}")
    for method in ("plain", "draft"):
        for batch in (1, 16):
            serial, overlap = (tokens_per_s(method, target, draft, o, batch) for o in (False, True))
            print(f"{method:>14} {batch:>5} {serial:>12.1f} {overlap:>13.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
