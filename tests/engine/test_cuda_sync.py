"""On CUDA: a decode step of each chain method under `torch.cuda.set_sync_debug_mode("error")`
(any synchronizing op raises) except the one sanctioned read, which is counted."""

from __future__ import annotations

import pytest
import torch
from testkit import CHAIN_METHODS, MIXED_PROMPTS, noisy_copy, tiny_hf_model, tiny_llm

from speculant import SamplingParams
from speculant.utils import sync

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

METHODS = CHAIN_METHODS
PARAMS = [
    SamplingParams(max_tokens=12, temperature=0),
    SamplingParams(max_tokens=12, temperature=0.8, seed=5, logprobs=True, top_logprobs=2),
    SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9),
]


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("method", METHODS)
def test_decode_steps_sync_only_in_the_one_read(method, overlap):
    target = tiny_hf_model("llama")
    kwargs = {**METHODS[method], "device": "cuda", "overlap": overlap}
    llm = tiny_llm(target, noisy_copy(target) if kwargs.get("speculative") == "draft" else None, **kwargs)
    for i, prompt in enumerate(MIXED_PROMPTS[:8]):
        llm.engine.add_request(prompt, PARAMS[i % 3])
    while not all(r.output_token_ids for r in llm.engine.requests.values()):
        llm.engine.step()
    before = sync.host_reads()
    torch.cuda.set_sync_debug_mode("error")
    try:
        llm.engine.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert sync.host_reads() - before == 1
