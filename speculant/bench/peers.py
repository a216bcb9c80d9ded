"""Peers on the same weights and prompts (batch 1): transformers `generate`, its prompt lookup,
and its assisted generation when a draft model is given."""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from speculant.bench.common import hf_twin
from speculant.bench.datasets import Conversation
from speculant.bench.suite import ItemRun, MethodRun


def run_peers(checkpoint, items: list[Conversation], max_tokens: int, temperature: float,
              num_draft_tokens: int, draft_checkpoint=None, progress: bool = True) -> list[MethodRun]:
    """One MethodRun (batch 1) per peer configuration; each item's turns follow its own answers."""
    model = hf_twin(checkpoint)
    configs = {"hf-generate": {}, "hf-prompt-lookup": {"prompt_lookup_num_tokens": num_draft_tokens}}
    if draft_checkpoint is not None:
        configs["hf-assisted"] = {"assistant_model": hf_twin(draft_checkpoint)}
    runs = []
    for name, kwargs in configs.items():
        run = MethodRun(name, 1)
        for item in tqdm(items, desc=name, disable=not progress):
            run.items.append(_run_item(model, checkpoint.tokenizer, item, max_tokens, temperature, kwargs))
        run.wall_s = sum(r.latency_s for r in run.items)
        runs.append(run)
    return runs


def _run_item(model, tokenizer, item: Conversation, max_tokens: int, temperature: float, kwargs: dict) -> ItemRun:
    from speculant.bench.suite import turn_messages

    r = ItemRun(item)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    eos = model.config.eos_token_id
    for turn in range(len(item.turns)):
        ids = torch.tensor([turn_messages(tokenizer, item, r.token_ids, turn)])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=eos or 0,
                                 **sampling, **kwargs)
        r.latency_s += time.perf_counter() - start
        r.token_ids.append(out[0, ids.shape[1]:].tolist())
    return r
