"""Our LlamaForCausalLM (and its variants) through the paged cache against transformers' logits
(tiny random Llama, Qwen2 with q/k/v bias, tied embeddings, Qwen3, Gemma 3 with sliding-window
layers shorter than the sequences, Phi-3), float32: every row of a ragged two-forward batch —
whole prefills, a prefill split into chunks, decodes and multi-token verification."""

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
ATOL = 2e-5  # float32 logits of magnitude ~3; observed max error is ~1.3e-6


def _executor(hf_model) -> Executor:
    executor = Executor(
        build_runner(TinyCheckpoint(hf_model), ModelConfig(model="tiny", attention_backend="torch"))
    )
    executor.allocate_kv(NUM_PAGES, PAGE_SIZE)
    return executor


def _run(executor: Executor, inputs: list[SeqInput]) -> tuple[torch.Tensor, torch.Tensor]:
    result = executor.run(ForwardPlan(TARGET, inputs))
    return result.logits, result.hidden


def _hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:  # [len(tokens), vocab]
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def _two_forwards(executor, seqs: dict[str, list[int]], splits: dict[str, list[int]]):
    """Run each sequence in chunks [0, s1), [s1, s2), ... (one chunk per forward, all sequences in
    the same forward), logits at every row; return each sequence's logits in token order."""
    rng = np.random.default_rng(0)
    free = [int(p) for p in rng.permutation(NUM_PAGES)]  # scattered pages
    tables = {
        name: [free.pop() for _ in range(-(-len(t) // PAGE_SIZE))] for name, t in seqs.items()
    }
    bounds = {name: [0] + splits[name] + [len(t)] for name, t in seqs.items()}
    num_forwards = max(len(b) - 1 for b in bounds.values())
    logits = {name: [] for name in seqs}
    for f in range(num_forwards):
        names = [n for n in seqs if f < len(bounds[n]) - 1]
        inputs = [
            SeqInput(
                seqs[n][bounds[n][f] : bounds[n][f + 1]], bounds[n][f], tables[n], logits="all"
            )
            for n in names
        ]
        out, hidden = _run(executor, inputs)
        assert hidden.shape[0] == out.shape[0] == sum(len(s.token_ids) for s in inputs)
        rows = iter(out)
        for n, s in zip(names, inputs, strict=True):
            logits[n] += [next(rows) for _ in s.token_ids]
    return {n: torch.stack(rows) for n, rows in logits.items()}


def test_ragged_paged_batch_matches_transformers(tiny_kind: str) -> None:
    hf = tiny_hf_model(tiny_kind)
    executor = _executor(hf)
    gen = torch.Generator().manual_seed(1)
    lengths = {"prefill": 11, "chunked": 23, "decode": 9, "verify": 14, "one": 1}
    seqs = {n: torch.randint(3, 256, (k,), generator=gen).tolist() for n, k in lengths.items()}
    splits = {
        "prefill": [],  # one forward
        "chunked": [5, 13],  # chunked prefill across three forwards, chunks crossing pages
        "decode": [8],  # prefill, then one decode token
        "verify": [9],  # prefill, then five tokens at once (as in verification)
        "one": [],
    }
    ours = _two_forwards(executor, seqs, splits)
    for name, tokens in seqs.items():
        torch.testing.assert_close(ours[name], _hf_logits(hf, tokens), atol=ATOL, rtol=0, msg=name)


def test_positions_apart_from_slots(tiny_kind: str) -> None:
    """Explicit RoPE positions equal to the default ones give the same logits (tree path)."""
    hf = tiny_hf_model(tiny_kind, seed=3)
    executor = _executor(hf)
    tokens = list(range(10, 22))
    table = [5, 2, 9]
    out, _ = _run(executor, [SeqInput(tokens, 0, table, positions=list(range(12)), logits="all")])
    torch.testing.assert_close(out, _hf_logits(hf, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])  # gemma3: the nodes' sliding windows follow their positions
def test_tree_branch_equals_its_linear_path(kind: str) -> None:
    """A draft tree's node sees only its ancestors: its logits equal those of the linear path."""
    hf = tiny_hf_model(kind, seed=4)
    executor = _executor(hf)
    prefix = [7, 8, 9, 10, 11]
    table = [3, 17, 30]
    _run(executor, [SeqInput(prefix, 0, table, logits="none")])
    # Tree over new tokens: 0 -> (1, 2); 1 -> 3. Paths: [a, b, d] and [a, c].
    nodes, parents = [40, 41, 42, 43], [-1, 0, 0, 1]
    mask = ancestor_mask(parents)
    depths = [0, 1, 1, 2]
    tree = SeqInput(nodes, 5, table, positions=[5 + d for d in depths], logits="all", tree_mask=mask)
    out, _ = _run(executor, [tree])
    ref_bd = _hf_logits(hf, prefix + [40, 41, 43])[5:]
    ref_c = _hf_logits(hf, prefix + [40, 42])[6]
    torch.testing.assert_close(out[[0, 1, 3]], ref_bd, atol=ATOL, rtol=0)
    torch.testing.assert_close(out[2], ref_c, atol=ATOL, rtol=0)


def test_llama3_rope_scaling_matches_transformers() -> None:
    """Llama 3.1's frequency-dependent rope scaling, at positions past the original context."""
    rope = {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    }
    hf = tiny_hf_model("llama", seed=5, rope_parameters=rope, head_dim=32, num_attention_heads=2, num_key_value_heads=1)
    executor = _executor(hf)
    assert executor.arch().rope_scaling.kind == "llama3"
    tokens = torch.randint(3, 256, (150,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = _two_forwards(executor, {"long": tokens}, {"long": [100]})["long"]
    torch.testing.assert_close(ours, _hf_logits(hf, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "kind, rope",
    [
        ("qwen3", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}),
        ("gemma3", {"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    ],
    ids=["qwen3-yarn", "gemma3-linear"],
)  # fmt: skip
def test_rope_scaling_of_the_variants_matches_transformers(kind: str, rope: dict) -> None:
    hf = tiny_hf_model(kind, seed=6, rope_parameters=rope)
    executor = _executor(hf)
    assert executor.arch().rope_scaling.kind in ("yarn", "linear")
    tokens = torch.randint(3, 256, (150,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = _two_forwards(executor, {"long": tokens}, {"long": [100]})["long"]
    torch.testing.assert_close(ours, _hf_logits(hf, tokens), atol=ATOL, rtol=0)
