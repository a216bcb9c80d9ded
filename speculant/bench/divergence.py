"""Where speculative greedy output parts from plain greedy output, and whether each parting is a
near-tie of the plain run's own logits.

    python -m speculant.bench.divergence --model qwen2.5-coder-1.5b --weights auto \
        --draft-model qwen2.5-coder-0.5b --methods draft:k=2:adaptive_k=false,ngram:k=8 \
        --dataset data/prompts/categories.jsonl --num-prompts 10 --max-tokens 64

With quantized weights a verify of k + 1 rows does not round every row as a 1-row step does
(the int4/int8 kernels are row-invariant, attention and the bf16 activation casts are not), so
greedy speculative output may part from plain output where the plain run's top two tokens are
nearly tied. For each method and prompt (first turns, batch 1) this finds the first position
where the two outputs differ and reports the plain run's margin there: its top-1 minus top-2
logprob, and whether the speculative run took the plain run's second choice. A parting at a
large margin would be a bug, not rounding.
"""

from __future__ import annotations

import argparse
import json

from speculant.bench.command import method_llm, method_options, shared_checkpoints
from speculant.bench.common import print_table, write_json
from speculant.bench.datasets import load_dataset, select
from speculant.bench.suite import turn_messages
from speculant.config_options import (
    add_engine_arguments,
    build_engine_config,
    engine_config_from_args,
)
from speculant.sampling.params import SamplingParams


def first_divergence(plain: list[int], spec: list[int]) -> int | None:
    """The first index where the two token lists differ (one ending early counts), else None."""
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a != b:
            return i
    return None if len(plain) == len(spec) else min(len(plain), len(spec))


def parting(plain: list[int], tops: list[list[tuple[int, float]]], spec: list[int]) -> dict | None:
    """The first parting of `spec` from `plain` with the plain run's top-2 margin there (nats),
    and whether `spec` took the plain run's second choice; None when they agree."""
    i = first_divergence(plain, spec)
    if i is None or i >= len(plain) or i >= len(spec):
        return None if i is None else {"position": i, "margin": None, "runner_up": False}
    (_, first), (second_id, second) = tops[i][0], tops[i][1]
    return {"position": i, "margin": first - second, "runner_up": spec[i] == second_id}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_arguments(parser)
    parser.add_argument("--methods", required=True, help="comma-separated speculative methods with options, as in `speculant bench`")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--output", default=None, help="JSON file for the per-prompt partings")
    args = parser.parse_args(argv)
    base = engine_config_from_args(args)
    items = select(load_dataset(args.dataset), args.num_prompts)
    configs = {m: build_engine_config(method_options(m), base) for m in ["none", *args.methods.split(",")]}
    checkpoint, draft_checkpoint, _ = shared_checkpoints(base, configs)  # loaded once for every engine
    outputs = {}
    for method, config in configs.items():  # one engine at a time, each prompt alone (batch 1)
        llm = method_llm(config, checkpoint, draft_checkpoint)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0, logprobs=method == "none", top_logprobs=2 * (method == "none"))
        outputs[method] = [llm.generate([turn_messages(llm.tokenizer, item, [], 0)], params)[0] for item in items]
        llm.close()
    plain = outputs.pop("none")
    rows, details = [], {}
    for method, spec in outputs.items():
        found = [parting(p.token_ids, p.top_logprobs, s.token_ids) for p, s in zip(plain, spec)]
        parted = [f for f in found if f is not None]
        margins = [f["margin"] for f in parted if f["margin"] is not None]
        details[method] = [{"item": item.id, "category": item.category, **(f or {})} for item, f in zip(items, found)]
        rows.append({
            "method": method, "prompts": len(items), "parted": len(parted),
            "max_margin": max(margins, default=None), "runner_up": sum(f["runner_up"] for f in parted),
        })
    table = print_table(rows, ["method", "prompts", "parted", "max_margin", "runner_up"])
    result = {"setup": {"model": args.model, "weights": args.weights, "dataset": args.dataset, "max_tokens": args.max_tokens},
              "rows": rows, "partings": details, "table": table}
    if args.output:
        write_json(args.output, result)
    return result


if __name__ == "__main__":
    print(json.dumps(main()["rows"], indent=1))
