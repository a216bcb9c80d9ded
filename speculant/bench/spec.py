"""Speculative decoding side by side: speculant vs transformers' assisted generation.

    python -m speculant.bench.spec [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
                                   [--prompts 4] [--new-tokens 64]

Same HumanEval prompts, greedy, batch 1, fp32, one run. For each configuration: end-to-end output
tokens/s (prefill included, summed over prompts), τ (tokens per target forward), and the speedup
over the same system's own target-alone run. speculant's rows must emit exactly the target-alone
tokens (checked and reported).
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
from tqdm import tqdm

from speculant.bench.common import hf_twin, load_prompts, machine, print_table, write_json
from speculant.llm import LLM
from speculant.loader import load_checkpoint
from speculant.sampling.params import SamplingParams

OURS = [
    ("target alone", {}),
    ("draft k=2", {"speculative": "draft", "num_draft_tokens": 2}),
    ("draft k=4", {"speculative": "draft", "num_draft_tokens": 4}),
    ("draft k=4, bf16 draft", {"speculative": "draft", "num_draft_tokens": 4, "draft_dtype": "bfloat16"}),
    ("ngram k=4", {"speculative": "ngram", "num_draft_tokens": 4}),
]


def run_ours(args, target, draft, prompts: list[str]) -> list[dict]:
    rows, reference = [], None
    for name, kwargs in tqdm(OURS, desc="speculant"):
        llm = LLM(model=args.target, checkpoint=target, draft_model=args.draft,
                  draft_checkpoint=draft if kwargs.get("speculative") == "draft" else None, **kwargs)
        ids = [llm.tokenizer.encode(p) for p in prompts]
        params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
        llm.generate(ids[:1], SamplingParams(max_tokens=4, temperature=0))  # warm-up
        start = time.perf_counter()
        outs = [llm.generate([x], params)[0] for x in ids]
        elapsed = time.perf_counter() - start
        tokens = [o.token_ids for o in outs]
        reference = reference or tokens
        stats = llm.stats()
        rows.append({"system": "speculant", "config": name, "tok_s": sum(map(len, tokens)) / elapsed,
                     "tau": stats["tau"], "acceptance": stats["acceptance_rate"], "same_tokens": tokens == reference})
        del llm
        gc.collect()
    return rows


def run_transformers(args, target, draft, prompts: list[str], tokenizer) -> list[dict]:
    hf_target = hf_twin(target)
    configs = [
        ("target alone", {}),
        ("assisted (draft model)", {"assistant_model": hf_twin(draft)}),
        ("assisted, bf16 draft", {"assistant_model": hf_twin(draft, torch.bfloat16)}),
        ("prompt lookup k=4", {"prompt_lookup_num_tokens": 4}),
    ]
    rows = []
    for name, kwargs in tqdm(configs, desc="transformers"):
        count, start = 0, time.perf_counter()
        for p in prompts:
            ids = torch.tensor([tokenizer.encode(p)])
            with torch.inference_mode():
                out = hf_target.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                         do_sample=False, eos_token_id=None, pad_token_id=0, **kwargs)
            count += out.shape[1] - ids.shape[1]
        elapsed = time.perf_counter() - start
        rows.append({"system": "transformers", "config": name, "tok_s": count / elapsed, "tau": None,
                     "acceptance": None, "same_tokens": None})
    return rows


def add_speedups(rows: list[dict]) -> None:
    for system in {r["system"] for r in rows}:
        base = next(r["tok_s"] for r in rows if r["system"] == system and r["config"] == "target alone")
        for r in rows:
            if r["system"] == system:
                r["speedup"] = r["tok_s"] / base


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default="results/bench_spec.json")
    args = ap.parse_args(argv)
    target, draft = load_checkpoint(args.target), load_checkpoint(args.draft)
    prompts = load_prompts("humaneval", args.prompts)
    rows = run_ours(args, target, draft, prompts)
    rows += run_transformers(args, target, draft, prompts, target.tokenizer)
    add_speedups(rows)
    print(f"\n{args.target} (draft {args.draft}), fp32, batch 1, greedy, {args.prompts} HumanEval prompts x {args.new_tokens} tokens")
    table = print_table(rows, ["system", "config", "tok_s", "speedup", "tau", "acceptance", "same_tokens"])
    write_json(args.out, {"target": args.target, "draft": args.draft, "prompts": args.prompts,
                          "new_tokens": args.new_tokens, "machine": machine(), "rows": rows, "table": table,
                          "command": "python -m speculant.bench.spec " + " ".join(argv or [])})


if __name__ == "__main__":
    main()
