"""The llama.cpp comparison's end-to-end plumbing, on fake systems (no llama-cpp-python needed);
one real run on smollm2-135m's GGUF where llama-cpp-python is installed."""

from __future__ import annotations

import json
import sys

import pytest

from speculant.bench import llamacpp
from speculant.bench import llamacpp_e2e as e2e
from speculant.bench.datasets import Conversation


def fake(rate: float, ids: list[int]) -> e2e.E2ERunner:
    calls = []

    def run(prompt: list[int], n: int):
        calls.append((list(prompt), n))
        return n / rate, ids[:n]

    run.calls = calls
    return run


ITEMS = [Conversation("a", "math", ("q",)), Conversation("b", "math", ("q",)), Conversation("c", "code", ("q",))]
PROMPTS = [[1, 2, 3], [4, 5], [6]]


def test_measure_interleaves_and_summarizes_per_category():
    ref, fast, other = fake(10.0, [7, 8, 9, 10]), fake(20.0, [7, 8, 9, 10]), fake(5.0, [7, 8, 0, 0])
    runners = {"speculant auto plain": fast, e2e.REFERENCE: ref, "other": other}
    result = e2e.measure(runners, ITEMS, PROMPTS, 4, repeats=2)
    # one warm-up each, then every request by every system, twice, with the same prompt ids
    assert fast.calls[0] == (PROMPTS[0], 4) and ref.calls[1:] == fast.calls[1:] == [(p, 4) for p in PROMPTS] * 2
    first = result["requests"][0]
    assert first["prompt_tokens"] == 3 and first["systems"][e2e.REFERENCE]["tok_s"] == pytest.approx(10.0)
    rows = {r["system"]: r for r in e2e.summarize(result["requests"], list(runners))}
    assert rows["speculant auto plain"]["math"] == pytest.approx(20.0)
    assert rows["speculant auto plain"]["overall_ratio"] == pytest.approx(2.0)
    assert rows["other"]["code_ratio"] == pytest.approx(0.5) and rows[e2e.REFERENCE]["overall_ratio"] == 1.0
    same = e2e.agreement(result["ids"])
    assert same == {"speculant auto plain": "3/3", e2e.REFERENCE: "3/3", "other": "0/3"}
    table = e2e.markdown(list(rows.values()), same)
    assert "| math | code | overall |" in table and "20.0 (2.00x)" in table and "| 0/3 |" in table


def test_named_datasets_load_first_turns_round_robin():
    items = e2e.load_items("categories", 6)
    assert len(items) == 6 and len({i.category for i in items}) > 1
    if e2e.dataset_path("mt_bench").exists():
        assert all(len(i.turns) == 1 for i in e2e.load_items("mt_bench", 4))


def test_prompt_ids_use_the_chat_template(smol_tokenizer):
    ids = e2e.prompt_ids(smol_tokenizer, Conversation("x", "c", ("Hello there",)))
    text = smol_tokenizer.decode(ids)
    assert "Hello there" in text and text.rstrip().endswith("assistant")
    raw = e2e.prompt_ids(smol_tokenizer, Conversation("x", "c", ("def f():",), chat=False))
    assert smol_tokenizer.decode(raw) == "def f():"


def test_args_keep_decode_only_as_the_default():
    args = llamacpp.parse_args([])
    assert args.dataset is None and args.out == "results/llamacpp/decode.json"
    assert args.speculative == ["none", "ngram"] and not args.fixed_k
    assert llamacpp.parse_args(["--dataset", "mt_bench"]).out == "results/llamacpp/e2e_mt_bench.json"
    assert llamacpp.system_name("auto", "ngram", 4, False) == "speculant auto ngram adaptive k<=4"


def test_without_llama_cpp_it_says_so_and_exits(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if it were not installed
    llamacpp.main(["--dataset", "mt_bench", "--out", str(tmp_path / "r.json")])
    assert "not installed" in capsys.readouterr().out and not (tmp_path / "r.json").exists()


@pytest.mark.real_model
def test_real_end_to_end_run(tmp_path):
    pytest.importorskip("llama_cpp")
    out = tmp_path / "r.json"
    llamacpp.main(["--dataset", "categories", "--prompts", "2", "--new-tokens", "4", "--repeats", "1",
                   "--speculative", "none", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [r["system"] for r in report["rows"]] == ["speculant auto plain", e2e.REFERENCE]
    assert all(s["new_tokens"] == 4 for r in report["requests"] for s in r["systems"].values())
    assert out.with_suffix(".md").exists() and report["commit"]
