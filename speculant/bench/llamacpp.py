"""Decode speed, speculant vs llama.cpp, on the same GGUF, prompts, machine and run.

    python -m speculant.bench.llamacpp [--model smollm2-135m] [--prompts 8] [--new-tokens 64]
                                       [--weights auto fp32] [--num-draft-tokens 4]

Needs the optional bench dependency `llama-cpp-python` (it compiles llama.cpp from source:
`pip install llama-cpp-python`); without it the script says so and exits. Both systems get the
same chat-formatted token ids, one prompt at a time (batch 1), greedy, EOS ignored. Each system
runs plain and with prompt-lookup (n-gram) speculation: speculant's `ngram` proposer, llama.cpp's
`LlamaPromptLookupDecoding`. Decode tok/s = (N - 1) / (t(N tokens) - t(1 token)), prefill taken
out for both alike; every prompt is timed by every configuration in turn (interleaved), and the
per-configuration figure is total tokens over total time across prompts, median of --repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from speculant.bench.common import load_prompts, machine, print_table, write_json
from speculant.config import EngineConfig, ModelConfig, NgramConfig, SpeculativeConfig
from speculant.llm import LLM
from speculant.sampling.params import SamplingParams

Runner = Callable[[list[int], int], float]  # (prompt ids, new tokens) -> seconds


def speculant_runner(model: str, weights: str, method: str, k: int) -> tuple[Runner, LLM]:
    config = EngineConfig(
        model=ModelConfig(model=model, weights=weights),
        speculative=SpeculativeConfig(method=method, num_draft_tokens=k, ngram=NgramConfig()),
    )
    llm = LLM(config=config)

    def run(ids: list[int], n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([ids], params)
        return time.perf_counter() - start

    return run, llm


def llamacpp_runner(path: str, k: int | None, threads: int) -> Runner:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if k else None
    llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_batch=512, draft_model=draft, verbose=False)
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-set", default="mt_bench", choices=["mt_bench", "humaneval"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--weights", nargs="+", default=["auto"])
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--out", default="results/bench_llamacpp.json")
    args = ap.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed (pip install llama-cpp-python): nothing to compare")
        return
    from speculant.loader.registry import resolve_model_path

    path, k = str(resolve_model_path(args.model)), args.num_draft_tokens
    runners, llms = {}, {}
    for weights in args.weights:
        for method in ("none", "ngram"):
            name = f"speculant {weights} {'plain' if method == 'none' else f'ngram k={k}'}"
            runners[name], llms[name] = speculant_runner(args.model, weights, method, k)
    threads = torch.get_num_threads()
    runners["llama.cpp plain"] = llamacpp_runner(path, None, threads)
    runners[f"llama.cpp prompt-lookup k={k}"] = llamacpp_runner(path, k, threads)
    first = next(iter(llms.values()))
    texts = load_prompts(args.prompt_set, args.prompts)
    prompts = [first.apply_chat_template([{"role": "user", "content": p}]) for p in texts]
    rates = decode_rates(runners, prompts, args.new_tokens, args.repeats)
    plain = rates["llama.cpp plain"]
    rows = [{"system": name, "decode_tok_s": rate, "vs_llama.cpp_plain": f"{rate / plain:.2f}x",
             "tau": _tau(llms.get(name))} for name, rate in rates.items()]
    print(f"\n{args.model} ({path.rsplit('/', 1)[-1]}), batch 1, {len(prompts)} {args.prompt_set} prompts, "
          f"{args.new_tokens} new tokens, greedy, {threads} threads, median of {args.repeats}")
    table = print_table(rows, ["system", "decode_tok_s", "vs_llama.cpp_plain", "tau"])
    write_json(args.out, {"args": vars(args), "machine": machine(),
                          "rows": rows, "table": table,
                          "command": "python -m speculant.bench.llamacpp " + " ".join(argv or [])})


def _tau(llm: LLM | None) -> str:
    stats = llm.stats() if llm is not None else {}
    return f"{stats['tau']:.2f}" if stats.get("draft_tokens") else "-"


if __name__ == "__main__":
    main()
