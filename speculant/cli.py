"""`speculant generate|serve|fetch`: the command line."""

from __future__ import annotations

import argparse
import json
import sys

from speculant.config import (
    CacheConfig,
    DraftModelConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from speculant.sampling.params import SamplingParams


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="registry name, HF folder or .gguf file")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "flashinfer"])
    p.add_argument("--seed", type=int, default=0, help="engine seed for requests without their own")
    p.add_argument("--speculative", default="none", choices=["none", "draft", "ngram"])
    p.add_argument("--draft-model", default=None)
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--draft-sampling", default="greedy", choices=["greedy", "sample"])
    p.add_argument("--draft-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the draft's dtype (default: --dtype); bfloat16 speeds a CPU draft's single-token steps")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-cache-mb", type=int, default=1024)
    p.add_argument("--memory-budget", type=float, default=None,
                   help="bytes for everything (weights, KV, workspaces), or a fraction in (0, 1] of free "
                        "device memory; the KV cache gets what the memory plan leaves (overrides --kv-cache-mb)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-waiting", type=int, default=1024)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(args.model, args.dtype, args.device, args.attention_backend, args.seed),
        cache=CacheConfig(page_size=args.page_size, kv_cache_bytes=args.kv_cache_mb << 20, memory_budget=args.memory_budget),
        scheduler=SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens, args.max_waiting),
        speculative=SpeculativeConfig(
            method=args.speculative,
            num_draft_tokens=args.num_draft_tokens,
            draft=DraftModelConfig(model=args.draft_model, sampling=args.draft_sampling, dtype=args.draft_dtype),
        ),
    )


def _generate(args: argparse.Namespace) -> int:
    from speculant.llm import LLM

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.request_seed,
        stop=tuple(args.stop or ()),
    )
    llm = LLM(config=engine_config(args))
    if args.verbose:
        print(f"memory plan ({llm.engine.num_pages} KV pages):\n{llm.engine.memory.describe()}", file=sys.stderr)
    prompt = llm.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    if args.stream:
        out = None
        for out in llm.stream(prompt, params):
            print(out.new_text, end="", flush=True)
        print()
    else:
        (out,) = llm.generate([prompt], params)
        print(out.text)
    _print_stats(out, llm.stats(), args.speculative != "none")
    return 0


def _print_stats(out, engine_stats: dict, speculative: bool) -> None:
    s = out.stats
    line = (
        f"[{s.num_output_tokens} tokens, finish={out.finish_reason}, ttft={s.ttft_s * 1000:.0f} ms, "
        f"itl={s.inter_token_latency_s * 1000:.1f} ms, {s.tokens_per_s:.1f} tok/s"
    )
    if speculative:
        by_pos = ", ".join(f"{a:.2f}" for a in engine_stats["acceptance_by_position"])
        line += f", tau={s.tau:.2f}, acceptance={s.acceptance_rate:.2f} (by position: {by_pos})"
    print(line + "]", file=sys.stderr)


def _serve(args: argparse.Namespace) -> int:
    from speculant.server import run_server

    run_server(engine_config(args), host=args.host, port=args.port, model_name=args.served_model_name)
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from speculant.loader import resolve_model_path

    for name in args.names:
        print(json.dumps({"model": name, "path": str(resolve_model_path(name))}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speculant", description="LLM inference with speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for one prompt and print stats")
    _engine_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--request-seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--verbose", action="store_true", help="print the memory plan at start-up")
    gen.set_defaults(func=_generate)
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    _engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None)
    serve.set_defaults(func=_serve)
    fetch = sub.add_parser("fetch", help="download named models into the cache")
    fetch.add_argument("names", nargs="+")
    fetch.set_defaults(func=_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    from speculant.loader.errors import CheckpointError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, CheckpointError) as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
