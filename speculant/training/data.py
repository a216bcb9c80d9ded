"""Training conversations for a draft head: prompts from JSONL files, responses from the dataset
(teacher forcing) or from the target itself (self-distillation through `speculant.LLM`).

Every response, whichever its source, lands in `responses.jsonl` in the output folder as token
ids (`prompt_ids` under the chat template, `response_ids`), one line per example, appended batch
by batch, so an interrupted run resumes by skipping the ids already there.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tqdm import tqdm

# Evaluation sets: a head trained on them would report inflated acceptance.
EVALUATION_FOLDERS = ("mt_bench", "humaneval")
RESPONSES_FILE = "responses.jsonl"


@dataclass(frozen=True)
class Example:
    id: str  # "<file stem>:<line number>", stable across runs
    messages: tuple[dict, ...]  # the conversation up to the reply: {"role", "content"}
    answer: str | None  # the dataset's reply (None when the file has none)


def check_not_evaluation(path: pathlib.Path) -> None:
    parts = {p.lower() for p in path.resolve().parts}
    bad = parts.intersection(EVALUATION_FOLDERS)
    if bad:
        raise ValueError(f"--data {path}: files under {sorted(bad)[0]}/ are evaluation sets; never train on them")


def load_examples(
    paths: Iterable[str | pathlib.Path], max_prompts: int | None = None, extra: Iterable[list[Example]] = (),
) -> list[Example]:
    """Examples of every file (and of every `extra` list, after the files), interleaved round-robin
    so each source is represented when `max_prompts` cuts the list."""
    per_file, stems = [], set()
    for path in map(pathlib.Path, paths):
        check_not_evaluation(path)
        if not path.is_file():
            raise ValueError(f"--data {path}: no such file")
        if path.stem in stems:  # example ids are "<stem>:<line>"
            raise ValueError(f"--data {path}: two files named {path.stem!r}; rename one")
        stems.add(path.stem)
        per_file.append(list(_read_file(path)))
    per_file += [list(x) for x in extra if x]
    mixed = [ex for group in _round_robin(per_file) for ex in group]
    return mixed[:max_prompts] if max_prompts else mixed


def _round_robin(lists: list[list[Example]]) -> Iterator[list[Example]]:
    for i in range(max((len(x) for x in lists), default=0)):
        yield [x[i] for x in lists if i < len(x)]


def _read_file(path: pathlib.Path) -> Iterator[Example]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
            yield parse_record(record, f"{path.stem}:{number}")


def parse_record(record: dict, where: str) -> Example:
    """GSM8K (question/answer), self-instruct (instruction + instances[0] input/output),
    {"prompt", optional "response"/"answer"}, or {"messages": [...]} (a final assistant turn is
    the answer)."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    if "question" in record:
        return Example(where, (_user(record["question"]),), record.get("answer"))
    if "instruction" in record:
        instance = (record.get("instances") or [{}])[0]
        text = record["instruction"] + (f"\n\n{instance['input']}" if instance.get("input") else "")
        return Example(where, (_user(text),), instance.get("output"))
    if "prompt" in record:
        return Example(where, (_user(record["prompt"]),), record.get("response", record.get("answer")))
    if "messages" in record:
        messages = tuple(record["messages"])
        if messages and messages[-1].get("role") == "assistant":
            return Example(where, messages[:-1], messages[-1].get("content"))
        return Example(where, messages, None)
    raise ValueError(f"{where}: no field to read a prompt from (question, instruction, prompt or messages)")


def _user(text) -> dict:
    if not isinstance(text, str) or not text:
        raise ValueError(f"prompt text must be a non-empty string, got {text!r}")
    return {"role": "user", "content": text}


def prompt_ids(tokenizer, example: Example) -> list[int]:
    from speculant.llm import chat_prompt_ids

    return chat_prompt_ids(tokenizer, list(example.messages))


def answer_ids(tokenizer, example: Example) -> list[int]:
    """The dataset's reply as the target would emit it: its tokens, then end-of-sequence."""
    if not example.answer:
        raise ValueError(f"{example.id}: --responses dataset needs an answer; this example has none")
    ids = tokenizer.encode(example.answer, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


# ---- responses.jsonl ----------------------------------------------------------------------------


def read_responses(path: pathlib.Path) -> list[dict]:
    """Finished lines; a torn last line (an interrupted write) is dropped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def append_rows(path: pathlib.Path, rows: list[dict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()


def repair_rows(path: pathlib.Path, rows: list[dict]) -> None:
    """Rewrite the file without a torn last line so appends start on a fresh line."""
    if not path.exists():
        return
    text = path.read_text(encoding="utf-8")
    if len(text.splitlines()) != len(rows) or (text and not text.endswith("\n")):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _pending(out_dir: pathlib.Path, examples: list[Example]) -> tuple[pathlib.Path, list[Example]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESPONSES_FILE
    done_rows = read_responses(path)
    repair_rows(path, done_rows)
    done = {r["id"] for r in done_rows}
    return path, [ex for ex in examples if ex.id not in done]


def write_dataset_responses(tokenizer, examples: list[Example], out_dir: pathlib.Path) -> pathlib.Path:
    """Teacher forcing: the dataset's own replies, tokenized."""
    path, todo = _pending(out_dir, examples)
    rows = [_row(ex, prompt_ids(tokenizer, ex), answer_ids(tokenizer, ex)) for ex in todo]
    if rows:
        append_rows(path, rows)
    return path


def generate_responses(
    llm, examples: list[Example], out_dir: pathlib.Path, params, batch_size: int = 32, progress: bool = True,
    tokenizer=None,
) -> pathlib.Path:
    """Self-distillation: the target's own replies (`params`, greedy by default), `batch_size`
    prompts per `llm.generate` call, each batch appended as it finishes. Prompts go through
    `tokenizer`'s chat template (default: the LLM's tokenizer)."""
    tokenizer = tokenizer or llm.tokenizer
    path, todo = _pending(out_dir, examples)
    with tqdm(total=len(examples), initial=len(examples) - len(todo), desc="responses", disable=not progress) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            prompts = [prompt_ids(tokenizer, ex) for ex in batch]
            outputs = llm.generate(prompts, params)
            append_rows(path, [_row(ex, p, list(o.token_ids)) for ex, p, o in zip(batch, prompts, outputs)])
            bar.update(len(batch))
    return path


def _row(example: Example, prompt: list[int], response: list[int]) -> dict:
    return {"id": example.id, "prompt_ids": prompt, "response_ids": response}
