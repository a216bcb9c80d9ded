from __future__ import annotations

import gzip
import json

import pytest

from speculant.bench.datasets import Conversation, default_dataset, load_dataset, select


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_layouts(tmp_path):
    mt = load_dataset(_write(tmp_path / "mt.jsonl", [{"question_id": 7, "category": "math", "turns": ["a", "b"]}]))
    assert mt == [Conversation("7", "math", ("a", "b"))]
    plain = load_dataset(_write(tmp_path / "p.jsonl", [{"prompt": "hi"}, {"prompt": "yo", "category": "qa"}]))
    assert [(c.category, c.turns, c.chat) for c in plain] == [("default", ("hi",), True), ("qa", ("yo",), True)]
    with gzip.open(tmp_path / "he.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    (he,) = load_dataset(tmp_path / "he.jsonl.gz")
    assert (he.id, he.category, he.turns, he.chat) == ("HumanEval/0", "code", ("def f():\n",), False)


def test_bad_input_names_the_file_and_line(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_dataset(bad)
    bad.write_text('{"turns": []}\n')
    with pytest.raises(ValueError, match="'turns'"):
        load_dataset(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: not JSON"):
        load_dataset(bad)


def test_default_dataset_names_the_missing_path(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECULANT_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=str(tmp_path / "mt_bench" / "question.jsonl")):
        default_dataset()


def test_select_is_round_robin_over_categories():
    items = [Conversation(str(i), c, ("x",)) for i, c in enumerate("aaabbc")]
    assert [i.id for i in select(items, 4)] == ["0", "3", "5", "1"]
    assert select(items, None) == items and select(items, 99) == items
