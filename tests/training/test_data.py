"""Training data: prompt files of every supported shape, refusal of evaluation sets, responses
from the dataset and from the target, and resume of an interrupted generation."""

from __future__ import annotations

import json

import pytest
from testkit import tiny_llm

from speculant.sampling.params import SamplingParams
from speculant.training.data import (
    RESPONSES_FILE,
    Example,
    generate_responses,
    load_examples,
    parse_record,
    read_responses,
    write_dataset_responses,
)


def _write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_record_shapes():
    gsm = parse_record({"question": "2+2?", "answer": "4\n#### 4"}, "g:1")
    assert gsm.messages == ({"role": "user", "content": "2+2?"},) and gsm.answer == "4\n#### 4"
    instruct = parse_record({"instruction": "Fix it.", "instances": [{"input": "teh", "output": "the"}]}, "s:1")
    assert instruct.messages[0]["content"] == "Fix it.\n\nteh" and instruct.answer == "the"
    no_input = parse_record({"instruction": "Say hi.", "instances": [{"input": "", "output": "hi"}]}, "s:2")
    assert no_input.messages[0]["content"] == "Say hi."
    assert parse_record({"prompt": "p", "response": "r"}, "p:1") == Example("p:1", ({"role": "user", "content": "p"},), "r")
    chat = parse_record({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "m:1")
    assert chat.messages == ({"role": "user", "content": "a"},) and chat.answer == "b"


def test_bad_records_name_the_line(tmp_path):
    with pytest.raises(ValueError, match="x:1: no field to read a prompt"):
        parse_record({"text": "?"}, "x:1")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        load_examples([bad])


@pytest.mark.parametrize("folder", ["mt_bench", "humaneval"])
def test_evaluation_sets_are_refused(tmp_path, folder):
    path = _write_jsonl(tmp_path / folder / "question.jsonl", [{"prompt": "x"}])
    with pytest.raises(ValueError, match=f"under {folder}/ are evaluation sets"):
        load_examples([path])


def test_files_interleave_and_max_prompts_cuts(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}"} for i in range(5)])
    b = _write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"b{i}"} for i in range(2)])
    ids = [ex.id for ex in load_examples([a, b])]
    assert ids == ["a:1", "b:1", "a:2", "b:2", "a:3", "a:4", "a:5"]
    assert [ex.id for ex in load_examples([a, b], max_prompts=3)] == ["a:1", "b:1", "a:2"]


def test_files_with_the_same_name_are_refused(tmp_path):
    a = _write_jsonl(tmp_path / "x" / "train.jsonl", [{"prompt": "a"}])
    b = _write_jsonl(tmp_path / "y" / "train.jsonl", [{"prompt": "b"}])
    with pytest.raises(ValueError, match="two files named 'train'"):
        load_examples([a, b])


def test_dataset_responses_use_the_chat_template(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "2"}])
    write_dataset_responses(tokenizer, load_examples([path]), tmp_path / "out")
    (row,) = read_responses(tmp_path / "out" / RESPONSES_FILE)
    expected_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False, add_generation_prompt=True)
    assert row["prompt_ids"] == tokenizer.encode(expected_prompt, add_special_tokens=False)
    assert row["response_ids"] == tokenizer.encode("2", add_special_tokens=False) + [tokenizer.eos_token_id]


def test_dataset_responses_need_answers(tmp_path, tokenizer):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "no answer here"}])
    with pytest.raises(ValueError, match="p:1: --responses dataset needs an answer"):
        write_dataset_responses(tokenizer, load_examples([path]), tmp_path / "out")


class _Interrupted(Exception):
    pass


def _failing_after(llm, calls: int):
    """`llm` whose generate raises after `calls` successful calls (a killed run)."""
    real, count = llm.generate, [0]

    def generate(*args, **kwargs):
        if count[0] == calls:
            raise _Interrupted
        count[0] += 1
        return real(*args, **kwargs)

    llm.generate = generate
    return llm


def test_self_generation_resumes_where_it_stopped(tmp_path, hf_model, tokenizer):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"prompt number {i}"} for i in range(7)])
    examples = load_examples([path])
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    whole = tmp_path / "whole"
    generate_responses(tiny_llm(hf_model), examples, whole, params, batch_size=3, progress=False, tokenizer=tokenizer)

    cut = tmp_path / "cut"
    with pytest.raises(_Interrupted):
        generate_responses(_failing_after(tiny_llm(hf_model), 1), examples, cut, params, batch_size=3, progress=False, tokenizer=tokenizer)
    assert [r["id"] for r in read_responses(cut / RESPONSES_FILE)] == ["p:1", "p:2", "p:3"]
    with (cut / RESPONSES_FILE).open("a") as f:
        f.write('{"id": "p:4", "prompt_i')  # a line torn by the kill
    generate_responses(tiny_llm(hf_model), examples, cut, params, batch_size=3, progress=False, tokenizer=tokenizer)
    assert (cut / RESPONSES_FILE).read_text() == (whole / RESPONSES_FILE).read_text()
    rows = read_responses(whole / RESPONSES_FILE)
    assert [r["id"] for r in rows] == [ex.id for ex in examples]
    assert all(len(r["response_ids"]) == 6 for r in rows)
