"""Decode throughput, speculant vs transformers' `generate`, same model, dtype, prompts, machine.

    python -m speculant.bench.decode [--model smollm2-135m] [--batch-sizes 1 16] [--new-tokens 64]

Decode tokens/s = B * (N - 1) / (t(N tokens) - t(1 token)): the first token (prefill) is timed
separately and taken out, for both systems alike. Each figure is the median of --repeats runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from speculant.bench.common import hf_twin, load_prompts, machine, print_table, write_json
from speculant.llm import LLM
from speculant.sampling.params import SamplingParams


def chat_ids(llm: LLM, prompts: list[str]) -> list[list[int]]:
    return [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]


def time_speculant(llm: LLM, ids: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(ids, params)
    return time.perf_counter() - start, [o.token_ids for o in outs]


def time_transformers(model, ids: list[list[int]], n: int, pad_id: int) -> tuple[float, list[list[int]]]:
    width = max(len(x) for x in ids)
    input_ids = torch.tensor([[pad_id] * (width - len(x)) + x for x in ids])  # left padding
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
            do_sample=False, pad_token_id=pad_id, eos_token_id=None,
        )
    return time.perf_counter() - start, out[:, width:].tolist()


def decode_rate(timer, batch: int, n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t1, _ = timer(1)
        tn, _ = timer(n)
        rates.append(batch * (n - 1) / (tn - t1))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_decode.json")
    args = ap.parse_args(argv)
    from speculant.loader import load_checkpoint

    checkpoint = load_checkpoint(args.model)
    hf = hf_twin(checkpoint)
    llm = LLM(model=args.model, checkpoint=checkpoint, max_num_seqs=max(args.batch_sizes))
    prompts = load_prompts("mt_bench", max(args.batch_sizes))
    pad_id = llm.tokenizer.pad_token_id if llm.tokenizer.pad_token_id is not None else 0
    rows = []
    for batch in tqdm(args.batch_sizes, desc="batch sizes"):
        ids = chat_ids(llm, prompts[:batch])
        ours = decode_rate(lambda n, ids=ids: time_speculant(llm, ids, n), batch, args.new_tokens, args.repeats)
        theirs = decode_rate(lambda n, ids=ids: time_transformers(hf, ids, n, pad_id), batch, args.new_tokens, args.repeats)
        same = time_speculant(llm, ids[:1], 16)[1] == time_transformers(hf, ids[:1], 16, pad_id)[1]
        rows.append({"batch": batch, "speculant_tok_s": ours, "transformers_tok_s": theirs,
                     "ratio": ours / theirs, "greedy_tokens_equal_b1": same})
    print(f"\nmodel {args.model}, fp32, {args.new_tokens} new tokens, greedy, median of {args.repeats}")
    table = print_table(rows, ["batch", "speculant_tok_s", "transformers_tok_s", "ratio", "greedy_tokens_equal_b1"])
    write_json(args.out, {"model": args.model, "dtype": "float32", "new_tokens": args.new_tokens,
                          "machine": machine(), "rows": rows, "table": table,
                          "command": "python -m speculant.bench.decode " + " ".join(argv or [])})


if __name__ == "__main__":
    main()
