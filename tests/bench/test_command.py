"""`speculant bench` end to end on a tiny model with a real tokenizer, for each dataset layout."""

from __future__ import annotations

import gzip
import json

import pytest
from testkit import TinyCheckpoint

from speculant.bench.command import BenchOptions, run_bench
from speculant.config_options import build_engine_config
from speculant.sampling.params import SamplingParams

BASE = {"model": "tiny", "page_size": 4, "num_pages": 512, "num_draft_tokens": 3, "adaptive_k": False}  # every step at k


def _mt_bench(tmp_path):
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["Write one line about the sea.", "Now say it again, shorter."]},
        {"question_id": 2, "category": "math", "turns": ["What is 2 + 2? Repeat: 2 + 2 = 4, 2 + 2 = 4."]},
        {"question_id": 3, "category": "writing", "turns": ["List three colours."]},
    ]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, {"writing", "math"}


def _plain(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "a b c a b c a b"}) + "\n" + json.dumps({"prompt": "Hello there"}) + "\n")
    return path, {"default"}


def _humaneval(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(2):
            f.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    return x + x + x\n"}) + "\n")
    return path, {"code"}


@pytest.mark.parametrize("make", [_mt_bench, _plain, _humaneval])
def test_every_method_batch_and_category_is_reported(tmp_path, tiny_checkpoint, tiny_model, make):
    dataset, categories = make(tmp_path)
    base = build_engine_config({**BASE, "draft_model": "tiny-draft"})
    opts = BenchOptions(methods=("none", "ngram", "draft"), dataset=str(dataset), num_prompts=None, max_tokens=10,
                        batch_sizes=(1, 2), output=str(tmp_path / "out"), progress=False)
    result = run_bench(base, opts, checkpoint=tiny_checkpoint, draft_checkpoint=TinyCheckpoint(tiny_model))
    rows = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
    keys = {(r["method"], r["batch"], r["category"]) for r in rows}
    assert keys == {(m, b, c) for m in opts.methods for b in (1, 2) for c in categories | {"all"}}
    for r in rows:
        assert r["output_tokens"] > 0 and r["tok_s"] > 0 and r["ttft_p50_ms"] is not None
        if r["method"] != "none":  # greedy: speculation emits exactly the plain tokens
            assert r["same_tokens"] is True, r
        if r["method"] == "draft":
            assert r["acceptance"] == 1.0  # the draft model is the target itself
    draft_all = [r for r in rows if r["method"] == "draft" and r["category"] == "all"]
    assert all(r["acceptance_by_position"] == [1.0] * 3 for r in draft_all)
    assert all(r["chosen_k_histogram"].get("3", 0) > 0 and 0 < r["mean_k"] <= 3 for r in draft_all)  # k per request and step
    none_all = [r for r in rows if r["method"] == "none" and r["category"] == "all"]
    assert all(r["chosen_k_histogram"] == {} and r["mean_k"] is None for r in none_all)
    for name in ("speedup_by_category", "acceptance_by_position", "throughput_vs_batch"):
        assert (tmp_path / "out" / f"{name}.png").stat().st_size > 1000
    assert result["table"].startswith("| method | batch | category |")
    assert len(result["table"].splitlines()) == len(rows) + 2


def test_multi_turn_feeds_the_previous_answer(tmp_path, tiny_checkpoint):
    from speculant.bench.datasets import load_dataset
    from speculant.bench.suite import turn_messages

    (item, *_) = load_dataset(_mt_bench(tmp_path)[0])
    tok = tiny_checkpoint.tokenizer
    answer = tok.encode("The sea is wide.", add_special_tokens=False)
    text = tok.decode(turn_messages(tok, item, [answer], 1))
    assert text.index(item.turns[0]) < text.index("The sea is wide.") < text.index(item.turns[1])


def test_sampled_runs_report_no_token_equality(tmp_path, tiny_checkpoint):
    dataset, _ = _plain(tmp_path)
    opts = BenchOptions(methods=("none", "ngram"), dataset=str(dataset), max_tokens=6, batch_sizes=(1,),
                        temperature=0.8, progress=False)
    result = run_bench(build_engine_config(BASE), opts, checkpoint=tiny_checkpoint)
    assert all(r["same_tokens"] is None for r in result["rows"])


def test_peers_run_on_the_same_weights(tmp_path, tiny_checkpoint):
    dataset, _ = _plain(tmp_path)
    opts = BenchOptions(methods=("none",), dataset=str(dataset), max_tokens=6, batch_sizes=(1,),
                        peers=True, output=str(tmp_path / "out"), progress=False)
    rows = run_bench(build_engine_config(BASE), opts, checkpoint=tiny_checkpoint)["rows"]
    peers = {r["method"] for r in rows} - {"none"}
    assert peers == {"hf-generate", "hf-prompt-lookup"}
    for r in rows:
        assert r["output_tokens"] > 0 and r["speedup"] is not None
        if r["method"] != "none":
            assert isinstance(r["same_tokens"], bool) and r["tau"] is None


def test_method_specs_carry_engine_options(tmp_path, tiny_checkpoint):
    from speculant.bench.command import method_options, parse_methods

    assert parse_methods("ngram:k=2,ngram:k=5:ngram_max_n=2") == ("none", "ngram:k=2", "ngram:k=5:ngram_max_n=2")
    assert method_options("ngram:k=5:ngram_max_n=2") == {"speculative": "ngram", "num_draft_tokens": 5, "ngram_max_n": 2}
    assert method_options("ngram:adaptive_k=true")["adaptive_k"] is True
    with pytest.raises(ValueError, match="bogus"):
        parse_methods("ngram:bogus=1")
    with pytest.raises(ValueError, match="one of"):
        parse_methods("nope:k=1")
    dataset, _ = _plain(tmp_path)
    opts = BenchOptions(methods=("none", "ngram:k=1", "ngram:k=4"), dataset=str(dataset), max_tokens=8, batch_sizes=(1,), progress=False)
    result = run_bench(build_engine_config(BASE), opts, checkpoint=tiny_checkpoint)
    by_method = {r["method"]: r for r in result["rows"] if r["category"] == "all"}
    assert set(by_method) == {"none", "ngram:k=1", "ngram:k=4"}
    assert len(by_method["ngram:k=1"]["acceptance_by_position"]) <= 1


def test_max_turns_keeps_first_turns(tmp_path, tiny_checkpoint):
    dataset, _ = _mt_bench(tmp_path)
    opts = BenchOptions(methods=("none",), dataset=str(dataset), num_prompts=None, max_turns=1, max_tokens=4,
                        batch_sizes=(1,), progress=False)
    result = run_bench(build_engine_config(BASE), opts, checkpoint=tiny_checkpoint)
    (row,) = [r for r in result["rows"] if r["category"] == "all"]
    assert row["requests"] == 3  # one turn per item (the two-turn item is cut to its first)
    assert result["setup"]["max_turns"] == 1


def test_repeat_runs_every_item_again_after_all_of_them(tmp_path, tiny_checkpoint):
    """Repeated requests: the store of finished outputs lets n-gram lookup draft the repeats."""
    dataset, _ = _plain(tmp_path)
    opts = BenchOptions(methods=("none", "ngram", "ngram:ngram_store_tokens=0"), dataset=str(dataset), num_prompts=None,
                        repeat=3, max_tokens=8, batch_sizes=(1,), progress=False)
    result = run_bench(build_engine_config(BASE), opts, checkpoint=tiny_checkpoint)
    rows = {r["method"]: r for r in result["rows"] if r["category"] == "all"}
    assert rows["none"]["requests"] == rows["ngram"]["requests"] == 6 and result["setup"]["repeat"] == 3
    assert rows["ngram"]["same_tokens"]
    assert rows["ngram"]["tau"] > rows["ngram:ngram_store_tokens=0"]["tau"]  # the bench's requests share a user
    with pytest.raises(ValueError, match="--repeat"):
        run_bench(build_engine_config(BASE), BenchOptions(dataset=str(dataset), repeat=0), checkpoint=tiny_checkpoint)


def test_rounds_run_every_item_again_under_every_method_in_reversed_order(tmp_path, tiny_checkpoint, monkeypatch):
    """--rounds 3: each method runs each item 3 times, the methods stepping in turn (A B, B A,
    ... within a round) and each round starting from the other end (A B, B A, A B); every round has
    its own n-gram store scope, so a round's outputs draft nothing for the next (the τ of one round)."""
    import speculant.bench.suite as suite

    rounds, steps = [], []
    lockstep, advance = suite._lockstep, suite._InFlight.advance
    monkeypatch.setattr(suite, "_lockstep", lambda methods, *args: (rounds.append([llm for llm, _ in methods]), lockstep(methods, *args))[1])
    monkeypatch.setattr(suite._InFlight, "advance", lambda self: (steps.append(self.llm), advance(self))[1])
    dataset, _ = _plain(tmp_path)
    opts = dict(methods=("none", "ngram"), dataset=str(dataset), num_prompts=None, max_tokens=8, batch_sizes=(1,), progress=False)
    once = run_bench(build_engine_config(BASE), BenchOptions(**opts), checkpoint=tiny_checkpoint)
    rounds.clear()
    steps.clear()
    result = run_bench(build_engine_config(BASE), BenchOptions(**opts, rounds=3), checkpoint=tiny_checkpoint)
    none, ngram = rounds[0]
    assert rounds == [[none, ngram], [ngram, none], [none, ngram]]
    assert steps[:4] == [none, ngram, ngram, none]
    rows = {r["method"]: r for r in result["rows"] if r["category"] == "all"}
    assert rows["none"]["requests"] == rows["ngram"]["requests"] == 6 and result["setup"]["rounds"] == 3
    assert rows["ngram"]["same_tokens"]
    assert rows["ngram"]["tau"] == pytest.approx([r for r in once["rows"] if r["method"] == "ngram" and r["category"] == "all"][0]["tau"])
    with pytest.raises(ValueError, match="--rounds"):
        run_bench(build_engine_config(BASE), BenchOptions(dataset=str(dataset), rounds=0), checkpoint=tiny_checkpoint)


def test_each_method_is_timed_on_its_own_clock(tmp_path, tiny_checkpoint, monkeypatch):
    """Methods step in turn; one method's slow steps are not another's time."""
    import time

    import speculant.bench.suite as suite
    from speculant.bench.command import method_llm
    from speculant.bench.datasets import load_dataset

    slow, fast = (method_llm(build_engine_config(BASE), tiny_checkpoint, None) for _ in range(2))
    step = slow.engine.step
    monkeypatch.setattr(slow.engine, "step", lambda: (time.sleep(0.05), step())[1])
    items = load_dataset(_plain(tmp_path)[0])
    runs = suite.run_suite({"slow": slow, "fast": fast}, items, [1], SamplingParams(max_tokens=8, temperature=0), progress=False)
    by = {r.method: r for r in runs}
    assert by["slow"].steps == by["fast"].steps >= 8
    assert by["slow"].wall_s >= 0.05 * by["slow"].steps
    assert by["fast"].wall_s < 0.5 * by["slow"].wall_s  # the slow steps ran between the fast ones, and are not counted there
    for llm in (slow, fast):
        llm.close()


def test_categories_keep_only_their_items(tmp_path, tiny_checkpoint):
    dataset, _ = _mt_bench(tmp_path)
    opts = BenchOptions(methods=("none",), dataset=str(dataset), categories=("writing",), num_prompts=None, max_turns=1,
                        max_tokens=4, batch_sizes=(1,), progress=False)
    result = run_bench(build_engine_config(BASE), opts, checkpoint=tiny_checkpoint)
    assert {r["category"] for r in result["rows"]} == {"all", "writing"}
    assert [r for r in result["rows"] if r["category"] == "all"][0]["requests"] == 2
    with pytest.raises(ValueError, match="--categories.*poetry"):
        run_bench(build_engine_config(BASE), BenchOptions(dataset=str(dataset), categories=("poetry",)), checkpoint=tiny_checkpoint)


def test_checkpoints_are_loaded_as_the_engines_load_them(tmp_path, tiny_checkpoint, tiny_model, monkeypatch):
    """Under --weights int8 the target and the draft are read with their blocks kept quantized
    (the engine's own loading), not widened to fp32 first: one copy each, shared by every method,
    and let go once the engines hold their own (packed) weights."""
    import speculant.executor.loading as loading

    asked, loaded = [], []

    def fake_load(name, model_config):
        asked.append((name, model_config.weights, model_config.dtype))
        loaded.append(TinyCheckpoint(tiny_model, tiny_checkpoint.tokenizer))
        return loaded[-1]

    monkeypatch.setattr(loading, "load_checkpoint_for", fake_load)
    dataset, _ = _plain(tmp_path)
    base = build_engine_config({**BASE, "draft_model": "tiny-draft", "weights": "int8"})
    opts = BenchOptions(methods=("none", "draft", "draft:k=2"), dataset=str(dataset), num_prompts=1, max_tokens=4,
                        batch_sizes=(1,), output=str(tmp_path / "out"), progress=False)
    rows = run_bench(base, opts)["rows"]
    assert asked == [("tiny", "int8", "float32"), ("tiny-draft", "int8", "float32")]
    assert all(r["same_tokens"] is not False for r in rows)
    assert all(not c.weights for c in loaded)  # once the engines are built, the bench lets its checkpoints go
