"""`speculant generate|serve|bench|train-head|fetch`: the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys

from speculant.config import EngineConfig
from speculant.config_options import add_engine_arguments, engine_config_from_args
from speculant.sampling.params import SamplingParams


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine config of a subcommand's flags (`add_engine_arguments` made them)."""
    return engine_config_from_args(args)


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
    _print_stats(out, llm.stats(), llm.config)
    llm.close()
    return 0


def _print_stats(out, engine_stats: dict, config) -> None:
    s, spec = out.stats, config.speculative
    line = (
        f"[{s.num_output_tokens} tokens, finish={out.finish_reason}, ttft={s.ttft_s * 1000:.0f} ms, "
        f"itl={s.inter_token_latency_s * 1000:.1f} ms, {s.tokens_per_s:.1f} tok/s, weights={config.model.weights}, "
        f"speculative={spec.method}{' (adaptive k)' if spec.enabled and spec.adaptive_k else ''}"
    )
    if spec.enabled:
        by_pos = ", ".join(f"{a:.2f}" for a in engine_stats["acceptance_by_position"])
        line += f", tau={s.tau:.2f}, acceptance={s.acceptance_rate:.2f} (by position: {by_pos})"
    print(line + "]", file=sys.stderr)


def _serve(args: argparse.Namespace) -> int:
    from speculant.server import ServerOptions, run_server

    options = ServerOptions(
        api_key=args.api_key or os.environ.get("SPECULANT_API_KEY") or None,
        allowed_origins=tuple(o.strip() for o in (args.allowed_origins or "").split(",") if o.strip()),
        enable_docs=args.enable_docs,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections or None,
        drain_timeout_s=args.drain_timeout,
    )
    return run_server(engine_config(args), host=args.host, port=args.port, model_name=args.served_model_name, options=options)


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/ (default: $SPECULANT_API_KEY)")
    p.add_argument("--allowed-origins", default=None, help="comma-separated CORS origins ('*' for any; default: no CORS)")
    p.add_argument("--enable-docs", action="store_true", help="serve /docs, /redoc and /openapi.json")
    p.add_argument("--max-body-mb", type=float, default=4.0, help="larger request bodies get 413")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds a connection has to send its request head")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request has to send its whole body")
    p.add_argument("--max-connections", type=int, default=512, help="concurrent connections before 503s (0: no limit)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM/SIGINT")


def _bench(args: argparse.Namespace) -> int:
    from speculant.bench.command import BenchOptions, run_bench

    if args.speculative is not None:
        raise ValueError("--speculative: bench runs every method of --methods; list them there")
    opts = BenchOptions(
        methods=args.methods, dataset=args.dataset, categories=args.categories, num_prompts=args.num_prompts, max_turns=args.max_turns, repeat=args.repeat, rounds=args.rounds, max_tokens=args.max_tokens,
        batch_sizes=args.batch_sizes, temperature=args.temperature, seed=args.request_seed,
        output=args.output, peers=args.peers, progress=not args.no_progress,
    )
    result = run_bench(engine_config(args), opts)
    print(result["table"])
    print(f"[{result['setup']['items']} items, wall {result['setup']['wall_s']:.0f} s]", file=sys.stderr)
    return 0


def _bench_args(p: argparse.ArgumentParser) -> None:
    from speculant.bench.command import parse_batch_sizes, parse_categories, parse_methods

    p.add_argument("--dataset", default=None, help="JSONL: MT-bench/Spec-Bench turns, {\"prompt\": ...} or HumanEval (.jsonl.gz too); default: MT-bench under $SPECULANT_DATA or ../shared/data")
    p.add_argument("--methods", type=_checked(parse_methods), default=("none", "ngram"), help="comma-separated speculation methods, each with optional engine options: mtp:k=2:head=PATH (none always runs, as the reference)")
    p.add_argument("--categories", type=_checked(parse_categories), default=None, help="comma-separated: keep only items of these categories")
    p.add_argument("--num-prompts", type=int, default=20, help="items, taken round-robin over categories")
    p.add_argument("--max-turns", type=int, default=None, help="keep each item's first N user turns (1: first turns only)")
    p.add_argument("--repeat", type=int, default=1, help="run every item N times, all items once before any repeat (repeated requests)")
    p.add_argument("--rounds", type=int, default=1, help="run every chunk of items N times under every method, the method order reversed each round (machine drift weighs on all alike)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", type=_checked(parse_batch_sizes), default=(1, 16), help="comma-separated, e.g. 1,16")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--request-seed", type=int, default=0, help="sampling seed of each request when temperature > 0")
    p.add_argument("--output", default=None, help="folder for bench.json and the PNG plots")
    p.add_argument("--peers", action="store_true", help="also time transformers generate and prompt lookup on the same weights (batch 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _checked(parse):
    """An argparse type from a parser raising ValueError (argparse then prints its message)."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__
    return convert


def _fetch(args: argparse.Namespace) -> int:
    from speculant.loader import resolve_model_path

    for name in args.names:
        print(json.dumps({"model": name, "path": str(resolve_model_path(name))}))
    return 0


def _train_head(args: argparse.Namespace) -> int:
    from speculant.training.command import run_train_head

    return run_train_head(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speculant", description="LLM inference with speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for one prompt and print stats")
    add_engine_arguments(gen)
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
    add_engine_arguments(serve)
    _server_args(serve)
    serve.set_defaults(func=_serve)
    bench = sub.add_parser("bench", help="every speculation method on the same prompts: speed, acceptance, latency")
    add_engine_arguments(bench)
    _bench_args(bench)
    bench.set_defaults(func=_bench)
    from speculant.training.command import add_train_head_arguments

    train = sub.add_parser("train-head", help="train a draft head (MTP/EAGLE) for a model: responses, hidden states, training")
    add_train_head_arguments(train)
    train.set_defaults(func=_train_head)
    fetch = sub.add_parser("fetch", help="download named models into the cache")
    fetch.add_argument("names", nargs="+")
    fetch.set_defaults(func=_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    from speculant.loader.errors import CheckpointError

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for commands that record how they ran
    try:
        if _torchrun_worker(args):  # a torchrun rank > 0 serves rank 0's engine instead
            from speculant.distributed.launch import run_torchrun_worker

            return run_torchrun_worker(engine_config(args))
        return args.func(args)
    except (ValueError, CheckpointError) as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _torchrun_worker(args: argparse.Namespace) -> bool:
    rank = os.environ.get("RANK")
    return rank not in (None, "0") and "WORLD_SIZE" in os.environ and (getattr(args, "tensor_parallel_size", None) or 1) > 1


if __name__ == "__main__":
    sys.exit(main())
