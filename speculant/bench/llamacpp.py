"""Speculant vs llama.cpp on the same GGUF, prompt token ids, machine and run.

    python -m speculant.bench.llamacpp [--model smollm2-135m] [--prompts 8] [--new-tokens 64]
                                       [--weights auto fp32] [--speculative none ngram]
                                       [--dataset mt_bench|categories|humaneval|FILE.jsonl]

Needs the optional bench dependency `llama-cpp-python` (the `llamacpp` extra; it compiles
llama.cpp from source); without it the script says so and exits. Both systems get the same
token ids (speculant's tokenizer and chat template), one prompt at a time (batch 1), greedy, EOS
ignored, and run plain and, with `ngram` among --speculative, with prompt lookup: speculant's
`ngram` proposer (adaptive k up to --num-draft-tokens unless --fixed-k; the cross-request n-gram
store off, since llama.cpp has none), llama.cpp's `LlamaPromptLookupDecoding` (fixed k).

Default mode, decode only: the first --prompts prompts of --prompt-set; decode tok/s =
(N - 1) / (t(N tokens) - t(1 token)), prefill taken out for both alike; every prompt timed by
every configuration in turn (interleaved), total tokens over total time, median of --repeats.

With --dataset, end to end (`speculant.bench.llamacpp_e2e`): --prompts items round-robin over
the categories, first turns; tok/s per request with prefill included, median per category and
overall, and each median over llama.cpp plain's; JSON to --out and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch

from speculant.bench import llamacpp_e2e as e2e
from speculant.bench.common import git_commit, load_prompts, machine, print_table, write_json
from speculant.config import (
    DraftModelConfig,
    EngineConfig,
    ModelConfig,
    NgramConfig,
    SpeculativeConfig,
)
from speculant.llm import LLM
from speculant.sampling.params import SamplingParams

Runner = Callable[[list[int], int], float]  # (prompt ids, new tokens) -> seconds


def speculant_llm(model: str, weights: str, method: str, k: int, adaptive: bool = True, draft: str | None = None) -> LLM:
    spec = SpeculativeConfig(method=method, num_draft_tokens=k, adaptive_k=adaptive, draft=DraftModelConfig(model=draft),
                             ngram=NgramConfig(store_tokens=0))  # no cross-request store: llama.cpp has none
    return LLM(config=EngineConfig(model=ModelConfig(model=model, weights=weights), speculative=spec))


def speculant_runner(llm: LLM) -> Runner:
    def run(ids: list[int], n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([ids], params)
        return time.perf_counter() - start

    return run


def llamacpp_llm(path: str, k: int | None, threads: int):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if k else None
    return Llama(model_path=path, n_ctx=4096, n_threads=threads, n_batch=512, draft_model=draft, verbose=False)


def llamacpp_runner(llm) -> Runner:
    no_eos = {llm.token_eos(): float("-inf")}

    def run(ids: list[int], n: int) -> float:
        llm.reset()  # no prefix reuse between calls: both systems prefill every time
        start = time.perf_counter()
        llm.create_completion(ids, max_tokens=n, temperature=0.0, top_k=1, logit_bias=no_eos)
        return time.perf_counter() - start

    return run


def decode_rates(runners: dict[str, Runner], prompts: list[list[int]], n: int, repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        tokens, seconds = dict.fromkeys(runners, 0.0), dict.fromkeys(runners, 0.0)
        for ids in prompts:
            for name, run in runners.items():  # interleaved: load spikes hit every system
                seconds[name] += run(ids, n) - run(ids, 1)
                tokens[name] += n - 1
        for name in runners:
            samples[name].append(tokens[name] / seconds[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-set", default="mt_bench", choices=["mt_bench", "humaneval"], help="decode-only mode's prompts")
    ap.add_argument("--dataset", default=None, help=f"end-to-end mode: {', '.join(e2e.DATASETS)} or a JSONL file")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--weights", nargs="+", default=["auto"])
    ap.add_argument("--speculative", nargs="+", default=["none", "ngram"], help="speculant methods (none: plain)")
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--fixed-k", action="store_true", help="speculant drafts k every step (default: adaptive k)")
    ap.add_argument("--draft-model", default=None, help="speculant's draft for --speculative draft (e.g. qwen2.5-coder-0.5b)")
    ap.add_argument("--threads", type=int, default=None, help="threads of both systems (default: torch's count)")
    ap.add_argument("--out", default=None, help="JSON path (default results/llamacpp/decode.json or e2e_<dataset>.json)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = f"results/llamacpp/{'decode' if args.dataset is None else 'e2e_' + pathlib.Path(args.dataset).stem}.json"
    return args


def system_name(weights: str, method: str, k: int, fixed: bool) -> str:
    if method == "none":
        return f"speculant {weights} plain"
    return f"speculant {weights} {method} {'k=' if fixed else 'adaptive k<='}{k}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed (pip install llama-cpp-python): nothing to compare")
        return
    from speculant.loader.registry import resolve_model_path

    path, k = str(resolve_model_path(args.model)), args.num_draft_tokens
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    llms = {system_name(w, m, k, args.fixed_k): speculant_llm(args.model, w, m, k, not args.fixed_k, args.draft_model)
            for w in args.weights for m in args.speculative}
    threads = torch.get_num_threads()
    peers = {e2e.REFERENCE: llamacpp_llm(path, None, threads)}
    if "ngram" in args.speculative:
        peers[f"llama.cpp prompt-lookup k={k}"] = llamacpp_llm(path, k, threads)
    tokenizer = next(iter(llms.values())).tokenizer
    setup = {"args": vars(args), "machine": machine(), "commit": git_commit(), "gguf": path,
             "llama_cpp_python": llama_cpp.__version__, "threads": threads,
             "command": " ".join(["python -m speculant.bench.llamacpp", *(sys.argv[1:] if argv is None else argv)])}
    if args.dataset is None:
        _decode_only(args, llms, peers, tokenizer, setup)
    else:
        _end_to_end(args, llms, peers, tokenizer, setup)


def _decode_only(args, llms: dict, peers: dict, tokenizer, setup: dict) -> None:
    runners = {name: speculant_runner(llm) for name, llm in llms.items()}
    runners.update({name: llamacpp_runner(llm) for name, llm in peers.items()})
    texts = load_prompts(args.prompt_set, args.prompts)
    prompts = [e2e.prompt_ids(tokenizer, e2e.Conversation(str(i), "-", (t,)))
               for i, t in enumerate(texts)]
    rates = decode_rates(runners, prompts, args.new_tokens, args.repeats)
    plain = rates[e2e.REFERENCE]
    rows = [{"system": name, "decode_tok_s": rate, "vs_llama.cpp_plain": f"{rate / plain:.2f}x",
             "tau": _tau(llms.get(name))} for name, rate in rates.items()]
    print(f"\n{args.model} ({setup['gguf'].rsplit('/', 1)[-1]}), batch 1, {len(prompts)} {args.prompt_set} prompts, "
          f"{args.new_tokens} new tokens, greedy, {setup['threads']} threads, median of {args.repeats}, commit {setup['commit']}")
    table = print_table(rows, ["system", "decode_tok_s", "vs_llama.cpp_plain", "tau"])
    write_json(args.out, {**setup, "mode": "decode", "rows": rows, "table": table})


def _end_to_end(args, llms: dict, peers: dict, tokenizer, setup: dict) -> None:
    items = e2e.load_items(args.dataset, args.prompts)
    prompts = [e2e.prompt_ids(tokenizer, item) for item in items]
    runners = {name: e2e.speculant_e2e(llm) for name, llm in llms.items()}
    runners.update({name: e2e.llamacpp_e2e(llm) for name, llm in peers.items()})
    result = e2e.measure(runners, items, prompts, args.new_tokens, args.repeats)
    rows = e2e.summarize(result["requests"], list(runners))
    same = e2e.agreement(result["ids"])
    taus = {name: _tau(llm) for name, llm in llms.items()}
    title = (f"{args.model} ({setup['gguf'].rsplit('/', 1)[-1]}), end to end with prefill, batch 1, {len(items)} "
             f"{args.dataset} first turns, {args.new_tokens} new tokens, greedy, EOS ignored, {setup['threads']} threads, "
             f"median of {args.repeats} per request, commit {setup['commit']}")
    table = e2e.markdown(rows, same)
    print(f"\n{title}\n\ntok/s (x llama.cpp plain), median over requests\n{table}\n\ntau: {taus}")
    write_json(args.out, {**setup, "mode": "end-to-end", "title": title, "rows": rows, "same_ids": same, "tau": taus,
                          "requests": result["requests"], "table": table})
    pathlib.Path(args.out).with_suffix(".md").write_text(
        f"{title}\n\n`{setup['command']}`\n\ntok/s (x llama.cpp plain), median over requests\n\n{table}\n\ntau: {taus}\n")


def _tau(llm: LLM | None) -> str:
    stats = llm.stats() if llm is not None else {}
    return f"{stats['tau']:.2f}" if stats.get("draft_tokens") else "-"


if __name__ == "__main__":
    main()
