"""Benchmark prompt sets: MT-bench / Spec-Bench, plain `{"prompt": ...}` and HumanEval JSONL; a
row's `json_schema` constrains its answers (structured outputs). `--dataset structured` is the
project's own JSON-schema prompt set (`structured_prompts.jsonl` beside this file)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
from dataclasses import dataclass

from speculant.bench.common import data_dir
from speculant.sampling.structured import StructuredOutput

STRUCTURED = pathlib.Path(__file__).with_name("structured_prompts.jsonl")


@dataclass(frozen=True)
class Conversation:
    """One benchmark item: user turns, each fed after the model's answer to the previous one."""

    id: str
    category: str
    turns: tuple[str, ...]
    chat: bool = True  # wrapped in the chat template (HumanEval stubs are completed as they are)
    structured: StructuredOutput | None = None  # the grammar every answer must match


def default_dataset() -> pathlib.Path:
    """MT-bench beside the checkout (or under $SPECULANT_DATA); a clear error when it is missing."""
    path = data_dir() / "mt_bench" / "question.jsonl"
    if not path.exists():
        raise ValueError(f"--dataset not given and the default MT-bench file {path} does not exist (set SPECULANT_DATA or pass --dataset)")
    return path


def load_dataset(path: str | pathlib.Path) -> list[Conversation]:
    """Every item of a JSONL (or .jsonl.gz) file; the layout is read from each line's fields."""
    path = STRUCTURED if str(path) == "structured" else pathlib.Path(path)
    if not path.exists():
        raise ValueError(f"--dataset: {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    items = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                items.append(_item(line, f"{path}:{n}"))
    if not items:
        raise ValueError(f"--dataset: {path} has no items")
    return items


def _item(line: str, where: str) -> Conversation:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    item = _layout(row, where)
    if "json_schema" in row:
        try:
            item = dataclasses.replace(item, structured=StructuredOutput.json_schema(row["json_schema"]))
        except ValueError as e:
            raise ValueError(f"{where}: json_schema: {e}") from None
    return item


def _layout(row: dict, where: str) -> Conversation:
    if "turns" in row:  # MT-bench / Spec-Bench
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{where}: 'turns' must be a non-empty list of strings")
        return Conversation(str(row.get("question_id", where)), str(row.get("category", "default")), tuple(turns))
    if "task_id" in row and isinstance(row.get("prompt"), str):  # HumanEval
        return Conversation(str(row["task_id"]), str(row.get("category", "code")), (row["prompt"],), chat=False)
    if isinstance(row.get("prompt"), str):
        return Conversation(str(row.get("id", where)), str(row.get("category", "default")), (row["prompt"],))
    raise ValueError(f"{where}: expected 'turns' (MT-bench), 'task_id' and 'prompt' (HumanEval) or 'prompt'")


def select(items: list[Conversation], n: int | None) -> list[Conversation]:
    """n items taken round-robin over categories (in file order within each), so a short run
    still covers every category; None or n >= len(items) keeps all."""
    if n is None or n >= len(items):
        return list(items)
    by_cat: dict[str, list[Conversation]] = {}
    for item in items:
        by_cat.setdefault(item.category, []).append(item)
    queues = list(by_cat.values())
    out: list[Conversation] = []
    while len(out) < n:
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out
