"""`speculant bench --dataset structured`: the project's JSON-schema prompt set loads, every
schema compiles, and every method's answers match their schema, with the plain run's tokens and
τ reported per category."""

from __future__ import annotations

import json

from testkit import TinyCheckpoint

from speculant.bench.command import BenchOptions, run_bench
from speculant.bench.datasets import load_dataset
from speculant.config_options import build_engine_config
from speculant.engine.grammar import GrammarCompiler

BASE = {"model": "tiny", "page_size": 4, "num_pages": 1024, "num_draft_tokens": 3, "adaptive_k": False}


def test_the_structured_prompt_set_compiles(smol_tokenizer):
    items = load_dataset("structured")
    assert len(items) >= 10 and {i.category for i in items} == {"extraction", "classification", "generation"}
    compiler = GrammarCompiler(smol_tokenizer, len(smol_tokenizer), {smol_tokenizer.eos_token_id})
    for item in items:
        compiler.check(item.structured)


def test_bench_runs_constrained_requests_for_every_method(tmp_path, tiny_checkpoint, tiny_model):
    base = build_engine_config({**BASE, "draft_model": "tiny-draft"})
    opts = BenchOptions(methods=("none", "ngram", "draft"), dataset="structured", num_prompts=3, max_tokens=24,
                        batch_sizes=(1, 2), output=str(tmp_path / "out"), progress=False)
    run_bench(base, opts, checkpoint=tiny_checkpoint, draft_checkpoint=TinyCheckpoint(tiny_model))
    rows = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
    assert {r["category"] for r in rows} == {"extraction", "classification", "generation", "all"}
    for r in rows:
        assert r["output_tokens"] > 0 and r["tau"] >= 1.0
        if r["method"] != "none":
            assert r["same_tokens"] is True, r
            assert r["speedup"] is not None
