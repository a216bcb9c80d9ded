"""`speculant bench`: load once, build one engine per method, run the suite, report."""

from __future__ import annotations

import pathlib
import sys
import time
from dataclasses import dataclass

from speculant.bench.common import machine
from speculant.bench.datasets import default_dataset, load_dataset, select
from speculant.bench.report import markdown_table, summarize, write_json
from speculant.bench.suite import run_suite
from speculant.config import EngineConfig
from speculant.config_options import build_engine_config
from speculant.sampling.params import SamplingParams


@dataclass(frozen=True)
class BenchOptions:
    methods: tuple[str, ...] = ("none", "ngram")
    dataset: str | None = None  # None: MT-bench beside the checkout
    num_prompts: int | None = 20
    max_tokens: int = 64
    batch_sizes: tuple[int, ...] = (1, 16)
    temperature: float = 0.0
    seed: int = 0
    output: str | None = None  # folder for bench.json and the PNGs
    peers: bool = False
    progress: bool = True


def parse_methods(text: str) -> tuple[str, ...]:
    """`none,ngram,draft` checked against the proposer registry; `none` always runs first."""
    from speculant.speculative.registry import available_methods

    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in available_methods()]
    if not methods or bad:
        raise ValueError(f"--methods: each must be one of {available_methods()}, got {bad or text!r}")
    return tuple(dict.fromkeys(["none"] + methods))


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--batch-sizes: expected integers >= 1, got {text!r}")
    return tuple(sorted(set(sizes)))


def run_bench(base: EngineConfig, opts: BenchOptions, checkpoint=None, draft_checkpoint=None) -> dict:
    """Run the benchmark; returns {"setup", "rows", "table"}; writes JSON and PNGs to opts.output."""
    from speculant.llm import LLM
    from speculant.loader import load_checkpoint

    path = pathlib.Path(opts.dataset) if opts.dataset else default_dataset()
    items = select(load_dataset(path), opts.num_prompts)
    checkpoint = checkpoint or load_checkpoint(base.model.model)
    if "draft" in opts.methods and base.speculative.draft.model is None:
        raise ValueError("--methods includes draft: give the draft model with --draft-model")
    if "draft" in opts.methods and draft_checkpoint is None:
        draft_checkpoint = load_checkpoint(base.speculative.draft.model)
    llms = {
        m: LLM(config=build_engine_config({"speculative": m}, base), checkpoint=checkpoint,
               draft_checkpoint=draft_checkpoint if m == "draft" else None)
        for m in opts.methods
    }
    params = SamplingParams(max_tokens=opts.max_tokens, temperature=opts.temperature, seed=opts.seed if opts.temperature > 0 else None)
    start = time.perf_counter()
    runs = run_suite(llms, items, list(opts.batch_sizes), params, progress=opts.progress)
    if opts.peers:
        from speculant.bench.peers import run_peers

        runs += run_peers(checkpoint, items, opts.max_tokens, opts.temperature,
                          base.speculative.num_draft_tokens, draft_checkpoint, opts.progress)
    rows = summarize(runs, greedy=opts.temperature == 0)
    setup = {
        "model": base.model.model, "draft_model": base.speculative.draft.model, "dataset": str(path),
        "items": len(items), "methods": list(opts.methods), "batch_sizes": list(opts.batch_sizes),
        "max_tokens": opts.max_tokens, "temperature": opts.temperature,
        "num_draft_tokens": base.speculative.num_draft_tokens, "dtype": base.model.dtype,
        "wall_s": time.perf_counter() - start, "machine": machine(),
    }
    table = markdown_table(rows)
    if opts.output:
        _write_outputs(pathlib.Path(opts.output), setup, rows)
    return {"setup": setup, "rows": rows, "table": table}


def _write_outputs(out: pathlib.Path, setup: dict, rows: list[dict]) -> None:
    from speculant.bench.bench_plots import write_plots

    write_json(out / "bench.json", setup, rows)
    title = f"{setup['model']}, {setup['items']} items from {pathlib.Path(setup['dataset']).name}, {setup['max_tokens']} tokens"
    for p in write_plots(rows, out, title):
        print(f"wrote {p}", file=sys.stderr)
