"""Our DeepSeek-V3 (MLA over the compressed paged cache, MoE, YaRN) against transformers'
`DeepseekV3ForCausalLM` on tiny random weights, float32: whole prefills, chunked prefills,
decodes and multi-token verification in one ragged batch, with and without q LoRA, through the
expanded and the absorbed MLA paths; tree masks; the cache's bytes and contents."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testkit import TinyCheckpoint, ancestor_mask, tiny_hf_model

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan

PAGE_SIZE, NUM_PAGES = 4, 64
ATOL = 2e-5  # float32 logits of magnitude ~3; observed max error ~2e-6
PATHS = {"auto": None, "absorbed": 10**9, "expanded": 0}  # model.expand_min_queries per MLA path


@pytest.fixture(scope="module", params=[48, None], ids=["q_lora", "plain_q"])
def hf(request):
    return tiny_hf_model("deepseek", seed=0, q_lora_rank=request.param)


def _executor(hf_model, path: str = "auto", dtype: str = "float32") -> Executor:
    runner = build_runner(TinyCheckpoint(hf_model), ModelConfig(model="tiny", dtype=dtype))
    if PATHS[path] is not None:
        runner.model.expand_min_queries = PATHS[path]
    executor = Executor(runner)
    executor.allocate_kv(NUM_PAGES, PAGE_SIZE)
    return executor


def _hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def _chunked(executor, seqs: dict[str, list[int]], splits: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Each sequence in chunks (one chunk per forward, all sequences side by side), scattered pages."""
    free = [int(p) for p in np.random.default_rng(0).permutation(NUM_PAGES)]
    tables = {n: [free.pop() for _ in range(-(-len(t) // PAGE_SIZE))] for n, t in seqs.items()}
    bounds = {n: [0] + splits[n] + [len(t)] for n, t in seqs.items()}
    logits = {n: [] for n in seqs}
    for f in range(max(len(b) - 1 for b in bounds.values())):
        names = [n for n in seqs if f < len(bounds[n]) - 1]
        inputs = [SeqInput(seqs[n][bounds[n][f] : bounds[n][f + 1]], bounds[n][f], tables[n], logits="all") for n in names]
        rows = iter(executor.run(ForwardPlan(TARGET, inputs)).logits)
        for n, s in zip(names, inputs, strict=True):
            logits[n] += [next(rows) for _ in s.token_ids]
    return {n: torch.stack(r) for n, r in logits.items()}


@pytest.mark.parametrize("path", list(PATHS))
def test_ragged_paged_batch_matches_transformers(hf, path):
    gen = torch.Generator().manual_seed(1)
    lengths = {"prefill": 21, "chunked": 40, "decode": 9, "verify": 14, "one": 1}
    seqs = {n: torch.randint(3, 256, (k,), generator=gen).tolist() for n, k in lengths.items()}
    splits = {"prefill": [], "chunked": [5, 22], "decode": [8], "verify": [9], "one": []}
    ours = _chunked(_executor(hf, path), seqs, splits)
    for name, tokens in seqs.items():
        torch.testing.assert_close(ours[name], _hf_logits(hf, tokens), atol=ATOL, rtol=0, msg=f"{path} {name}")


@pytest.mark.parametrize("path", ["absorbed", "expanded"])
def test_tree_branch_equals_its_linear_path(hf, path):
    """A tree node sees only its ancestors: its logits equal those of its linear path."""
    executor = _executor(hf, path)
    prefix, table = [7, 8, 9, 10, 11], [3, 17, 30]
    executor.run(ForwardPlan(TARGET, [SeqInput(prefix, 0, table, logits="none")]))
    nodes, parents, depths = [40, 41, 42, 43], [-1, 0, 0, 1], [0, 1, 1, 2]
    tree = SeqInput(nodes, 5, table, positions=[5 + d for d in depths], logits="all", tree_mask=ancestor_mask(parents))
    out = executor.run(ForwardPlan(TARGET, [tree])).logits
    torch.testing.assert_close(out[[0, 1, 3]], _hf_logits(hf, prefix + [40, 41, 43])[5:], atol=ATOL, rtol=0)
    torch.testing.assert_close(out[2], _hf_logits(hf, prefix + [40, 42])[6], atol=ATOL, rtol=0)


def test_absorbed_decode_equals_expanded(hf):
    """The same prefill then decode and verification steps, once per MLA path: equal logits."""
    tokens = torch.randint(3, 256, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    results = []
    for path in ("absorbed", "expanded"):
        executor, table = _executor(hf, path), list(range(8))
        steps = [(0, 20), (20, 21), (21, 22), (22, 27), (27, 30)]
        results.append(torch.cat([
            executor.run(ForwardPlan(TARGET, [SeqInput(tokens[a:b], a, table, logits="all")])).logits for a, b in steps
        ]))
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_holds_the_latent_only(hf, dtype):
    """Bytes per token per layer = (kv_lora_rank + qk_rope_head_dim) x dtype size."""
    runner = _executor(hf, dtype=dtype).runner()
    m, elt = runner.arch.mla, torch.empty(0, dtype=runner.dtype).element_size()
    per_token_layer = (m.kv_lora_rank + m.qk_rope_head_dim) * elt
    assert runner.kv_bytes_per_page(PAGE_SIZE) == runner.arch.num_layers * PAGE_SIZE * per_token_layer
    allocated = runner.kv.k.untyped_storage().nbytes() + (0 if runner.kv.v.data_ptr() == runner.kv.k.data_ptr() else runner.kv.v.untyped_storage().nbytes())
    assert allocated == NUM_PAGES * runner.kv_bytes_per_page(PAGE_SIZE)


def test_cached_rows_are_transformers_latents(hf):
    """What a token leaves in the cache is transformers' compressed KV: the normed c_kv and the
    rotated shared key, nothing per head."""
    from transformers import DynamicCache

    tokens = list(range(20, 33))
    executor, table = _executor(hf), [6, 1, 4, 9]
    executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, table, logits="none")]))
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(torch.tensor([tokens]), cache=cache, use_cache=True)
    runner = executor.runner()
    slots = runner.kv.slots(table, len(tokens))
    for i, layer in enumerate(cache.layers):
        expected = torch.cat([layer.keys[0, 0], layer.values[0, 0]], dim=-1)  # [S, R + r]
        torch.testing.assert_close(runner.kv.k[i, slots, 0], expected, atol=1e-5, rtol=0)


def _hf_greedy(hf_model, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(_hf_logits(hf_model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def test_greedy_generation_equals_transformers(hf):
    """Through `LLM`: a batch of prompts, long ones prefilled in chunks, 16 greedy tokens each."""
    from testkit import tiny_llm

    from speculant import SamplingParams

    prompts = [[5, 6, 7], list(range(30, 70)), [9], list(range(100, 121))]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outs = tiny_llm(hf, max_num_batched_tokens=24).generate(prompts, params)
    assert [o.token_ids for o in outs] == [_hf_greedy(hf, p, 16) for p in prompts]
