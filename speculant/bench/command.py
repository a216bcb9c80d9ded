"""`speculant bench`: load once, build one engine per method, run the suite, report."""

from __future__ import annotations

import argparse
import dataclasses
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
    categories: tuple[str, ...] | None = None  # keep only these categories (None: all)
    num_prompts: int | None = 20
    max_turns: int | None = None  # keep each item's first turns only (1: MT-bench first turns)
    repeat: int = 1  # every item this many times, all items once before any repeats (repeated requests)
    rounds: int = 1  # every chunk this many times under every method, the order reversed each round
    max_tokens: int = 64
    batch_sizes: tuple[int, ...] = (1, 16)
    temperature: float = 0.0
    seed: int = 0
    output: str | None = None  # folder for bench.json and the PNGs
    peers: bool = False
    progress: bool = True


_ALIASES = {"k": "num_draft_tokens"}


def parse_methods(text: str) -> tuple[str, ...]:
    """`none,ngram,mtp:k=2,mtp:k=3:head=PATH`: each a registry method, optionally with engine
    options after colons (`k` is num_draft_tokens); `none` always runs first. Each spec is also
    its label in the results."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise ValueError(f"--methods: expected comma-separated methods, got {text!r}")
    for m in methods:
        method_options(m)  # raises on a bad method or option
    return tuple(dict.fromkeys(["none"] + methods))


def method_options(spec: str) -> dict:
    """Engine options of one method spec: {"speculative": name, option: value, ...}."""
    from speculant.config_options import engine_options
    from speculant.speculative.registry import available_methods

    name, *pairs = spec.split(":")
    if name not in available_methods():
        raise ValueError(f"--methods: each must be one of {available_methods()} (with :option=value), got {name!r}")
    options, known = {"speculative": name}, {o.name: o for o in engine_options()}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = _ALIASES.get(key, key)
        if not sep or key not in known:
            raise ValueError(f"--methods: {spec!r}: expected option=value with an engine option (or k), got {pair!r}")
        option = known[key]
        try:
            options[key] = value.lower() in ("1", "true", "yes") if option.is_flag else option.parse_cli(value)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ValueError(f"--methods: {spec!r}: {key}: {exc}") from None
    return options


def parse_categories(text: str) -> tuple[str, ...]:
    categories = tuple(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if not categories:
        raise ValueError(f"--categories: expected comma-separated category names, got {text!r}")
    return categories


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--batch-sizes: expected integers >= 1, got {text!r}")
    return tuple(sorted(set(sizes)))


def shared_checkpoints(base: EngineConfig, configs: dict[str, EngineConfig], checkpoint=None, draft_checkpoint=None) -> tuple:
    """(target checkpoint, draft checkpoint or None, those loaded here): each loaded once, as an
    engine loads it (dtype; quantized GGUF blocks kept under --weights auto/int8/int4), for every
    method's engine to share; a checkpoint the caller passes is used as it is."""
    from speculant.executor.loading import load_checkpoint_for

    owned = []
    if checkpoint is None:
        checkpoint = load_checkpoint_for(base.model.model, base.model)
        owned.append(checkpoint)
    drafting = [c for c in configs.values() if c.speculative.method == "draft"]
    if any(c.speculative.draft.model is None for c in drafting):
        raise ValueError("--methods includes draft: give the draft model with --draft-model")
    if drafting and draft_checkpoint is None and len({c.speculative.draft.model for c in drafting}) == 1:
        draft = drafting[0].speculative.draft
        draft_checkpoint = load_checkpoint_for(draft.model, draft.model_config(drafting[0].model))
        owned.append(draft_checkpoint)
    return checkpoint, draft_checkpoint, owned


def method_llm(config: EngineConfig, checkpoint, draft_checkpoint):
    """One method's LLM over the shared checkpoints (the draft model's goes to draft-target only:
    an MTP method would read it as its head)."""
    from speculant.llm import LLM

    return LLM(config=config, checkpoint=checkpoint, draft_checkpoint=draft_checkpoint if config.speculative.method == "draft" else None)


def run_bench(base: EngineConfig, opts: BenchOptions, checkpoint=None, draft_checkpoint=None) -> dict:
    """Run the benchmark; returns {"setup", "rows", "table"}; writes JSON and PNGs to opts.output."""
    path = pathlib.Path(opts.dataset) if opts.dataset else default_dataset()
    items = load_dataset(path)
    if opts.categories is not None:
        missing = sorted(set(opts.categories) - {item.category for item in items})
        if missing:
            raise ValueError(f"--categories: {path} has no items of {missing}")
        items = [item for item in items if item.category in opts.categories]
    items = select(items, opts.num_prompts)
    if opts.max_turns is not None:
        items = [dataclasses.replace(item, turns=item.turns[: opts.max_turns]) for item in items]
    if opts.repeat < 1:
        raise ValueError(f"--repeat: expected an integer >= 1, got {opts.repeat}")
    if opts.rounds < 1:
        raise ValueError(f"--rounds: expected an integer >= 1, got {opts.rounds}")
    items = [dataclasses.replace(item, id=f"{item.id}#{r}" if r else item.id) for r in range(opts.repeat) for item in items]
    configs = {m: build_engine_config(method_options(m), base) for m in opts.methods}
    checkpoint, draft_checkpoint, owned = shared_checkpoints(base, configs, checkpoint, draft_checkpoint)
    llms = {m: method_llm(c, checkpoint, draft_checkpoint) for m, c in configs.items()}
    if not opts.peers:  # the engines hold what they run (packed copies, shared tensors): the rest is dead weight
        for loaded in owned:
            loaded.weights.clear()
    params = SamplingParams(max_tokens=opts.max_tokens, temperature=opts.temperature, seed=opts.seed if opts.temperature > 0 else None)
    start = time.perf_counter()
    try:
        runs = run_suite(llms, items, list(opts.batch_sizes), params, progress=opts.progress, rounds=opts.rounds)
    finally:
        for llm in llms.values():
            llm.close()
    if opts.peers:
        from speculant.bench.peers import run_peers

        runs += run_peers(checkpoint, items, opts.max_tokens, opts.temperature,
                          base.speculative.num_draft_tokens, draft_checkpoint, opts.progress)
    rows = summarize(runs, greedy=opts.temperature == 0)
    setup = {
        "model": base.model.model, "draft_model": base.speculative.draft.model, "dataset": str(path), "categories": opts.categories,
        "items": len(items), "methods": list(opts.methods), "batch_sizes": list(opts.batch_sizes),
        "max_tokens": opts.max_tokens, "max_turns": opts.max_turns, "repeat": opts.repeat, "rounds": opts.rounds, "temperature": opts.temperature,
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
