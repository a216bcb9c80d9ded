"""Prompts drawn from the target: the user-turn prefix of the chat template, what is kept, the
seeds, openings, resume after an interruption, and the examples they become."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from speculant.cli import main
from speculant.training.data import load_examples
from speculant.training.self_prompts import (
    SELF_PROMPTS_FILE,
    generate_self_prompts,
    read_self_prompts,
    user_turn_prefix,
)


class FakeLLM:
    """Answers request i (its seed) from a script: (text, finish_reason)."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append([p.seed for p in params])
        self.prompts = prompts
        assert all(p[: len(user_turn_prefix(self.tokenizer))] == user_turn_prefix(self.tokenizer) for p in prompts)
        return [SimpleNamespace(text=self.script[p.seed][0], finish_reason=self.script[p.seed][1]) for p in params]


def test_user_turn_prefix_is_the_template_up_to_the_message(tokenizer):
    assert tokenizer.decode(user_turn_prefix(tokenizer)) == "<s>user: "


def test_a_model_without_chat_template_is_refused(tokenizer):
    with pytest.raises(ValueError, match="--self-prompts: this model has no chat template"):
        user_turn_prefix(SimpleNamespace(chat_template=None))


def test_unfinished_short_and_repeated_questions_are_dropped(tmp_path, tokenizer):
    script = [
        ("  How do volcanoes form under the sea?  ", "stop"),
        ("Write a poem about a lighthouse keeper", "length"),  # cut off by max_tokens
        ("Hi there", "stop"),  # too short
        ("How do volcanoes form under the sea?", "stop"),  # a repeat
        ("Explain recursion to a ten year old.", "stop"),
    ]
    llm = FakeLLM(tokenizer, script)
    path = generate_self_prompts(llm, 5, tmp_path, seed=0, batch_size=2, progress=False)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["i"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["prompt"] for r in rows] == ["How do volcanoes form under the sea?", "", "", "", "Explain recursion to a ten year old."]
    examples = read_self_prompts(tmp_path)
    assert [e.id for e in examples] == ["self_prompts:0", "self_prompts:4"]
    assert examples[1].messages == ({"role": "user", "content": "Explain recursion to a ten year old."},)


def test_openings_start_the_user_turns_in_turn_and_stay_in_the_prompt(tmp_path, tokenizer):
    script = [(" a short poem about the harbour at night.", "stop"), (" a pirate captain. Describe your ship.", "stop"),
              (" a haiku about autumn leaves falling.", "stop")]
    llm = FakeLLM(tokenizer, script)
    generate_self_prompts(llm, 3, tmp_path, seed=0, batch_size=4, progress=False, openings=("Write", "Imagine you are"))
    prefix = user_turn_prefix(tokenizer)
    assert [tokenizer.decode(p[len(prefix):]) for p in llm.prompts] == ["Write", "Imagine you are", "Write"]
    assert [e.messages[0]["content"] for e in read_self_prompts(tmp_path)] == [
        "Write a short poem about the harbour at night.", "Imagine you are a pirate captain. Describe your ship.",
        "Write a haiku about autumn leaves falling."]


def test_a_rerun_resumes_at_the_next_index_with_the_same_seeds(tmp_path, tokenizer):
    script = [(f"Question number {i} about the sea?", "stop") for i in range(20)]
    llm = FakeLLM(tokenizer, script)
    path = generate_self_prompts(llm, 6, tmp_path, seed=3, batch_size=1, progress=False)  # chunks of 4
    assert llm.calls == [[3, 4, 5, 6], [7, 8]]
    with path.open("a") as f:
        f.write('{"i": 6, "prom')  # an interrupted write
    llm.calls.clear()
    generate_self_prompts(llm, 9, tmp_path, seed=3, batch_size=1, progress=False)
    assert llm.calls == [[9, 10, 11]]  # indices 6..8, seeds from 3
    assert [e.id for e in read_self_prompts(tmp_path)] == [f"self_prompts:{i}" for i in range(9)]
    assert read_self_prompts(tmp_path / "nowhere") == []


def test_self_prompts_join_the_round_robin_after_the_files(tmp_path, tokenizer):
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"file prompt {i}"}) + "\n" for i in range(3)))
    llm = FakeLLM(tokenizer, [(f"Self prompt number {i}?", "stop") for i in range(2)])
    generate_self_prompts(llm, 2, tmp_path, progress=False)
    ids = [e.id for e in load_examples([data], None, [read_self_prompts(tmp_path)])]
    assert ids == ["a:1", "self_prompts:0", "a:2", "self_prompts:1", "a:3"]


def test_the_cli_draws_prompts_without_data_files(tmp_path, model_dir):
    out = tmp_path / "out"
    args = ["train-head", "--model", str(model_dir), "--self-prompts", "6", "--gen-batch", "3", "--out", str(out),
            "--stop-after", "self-prompts", "--no-progress"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / SELF_PROMPTS_FILE).read_text().splitlines()]
    assert [r["i"] for r in rows] == list(range(6))


def test_no_data_and_no_self_prompts_is_an_error(tmp_path, model_dir, capsys):
    assert main(["train-head", "--model", str(model_dir), "--out", str(tmp_path / "out")]) == 2
    assert "--data: give at least one prompt file, or --self-prompts N" in capsys.readouterr().err
