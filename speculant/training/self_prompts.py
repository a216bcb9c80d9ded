"""User prompts written by the target itself (the "Magpie" recipe): the chat template up to the
start of a user turn, sampled, gives a question of the kind the model expects to be asked.

A draft head learns what the target says; self-distilling it on a few hundred hand-written prompts
leaves it fitted to their topics. Prompts drawn from the target cover whatever the target has seen
in chat tuning, for the cost of a short generation each. They land in `OUT/self_prompts.jsonl` as
`{"prompt"}` lines, one per finished, distinct question, appended batch by batch; request i is
sampled with seed `seed + i`, so the file is deterministic and an interrupted run resumes at the
next index.
"""

from __future__ import annotations

import pathlib

from tqdm import tqdm

from speculant.sampling.params import SamplingParams
from speculant.training.data import Example, append_rows, read_responses, repair_rows

SELF_PROMPTS_FILE = "self_prompts.jsonl"
_MARK = "\x00QUESTION\x00"
_MIN_CHARS = 16  # shorter "questions" are mostly fragments ("Hi", "Thanks!")


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's message text starts (its default
    system prompt included, as a real conversation has it)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("--self-prompts: this model has no chat template to draw user turns from")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    return tokenizer.encode(text[: text.index(_MARK)], add_special_tokens=False)


def generate_self_prompts(
    llm, count: int, out_dir: pathlib.Path, seed: int = 0, batch_size: int = 128, max_tokens: int = 96,
    temperature: float = 1.0, top_p: float = 0.95, progress: bool = True, openings: tuple[str, ...] = (),
) -> pathlib.Path:
    """Draw user questions from the target until `count` indices have been tried.

    `openings`: request i starts its user turn with openings[i % len(openings)] (e.g. "Write",
    "Imagine you are") and the target continues it, which steers the draws toward instructions
    and tasks rather than the short questions an open turn mostly gives; the opening is part of
    the kept prompt.

    Each line records its index (`"i"`), so a rerun skips what is done; a question that hit
    `max_tokens` before the end of the turn, is shorter than `_MIN_CHARS`, or repeats an earlier
    one is recorded as empty and skipped by readers."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SELF_PROMPTS_FILE
    rows = _read(path)
    repair_rows(path, rows)  # drop a torn line, so appends start on a fresh one
    seen = {r["prompt"] for r in rows if r["prompt"]}
    prefix = user_turn_prefix(llm.tokenizer)
    start = len(rows)
    with tqdm(total=count, initial=min(start, count), desc="self prompts", disable=not progress) as bar:
        chunk = 4 * batch_size  # the LLM keeps batch_size running; finished ones are replaced
        for first in range(start, count, chunk):
            indices = range(first, min(first + chunk, count))
            params = [SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed + i) for i in indices]
            starts = [openings[i % len(openings)] if openings else "" for i in indices]
            prompts = [prefix + llm.tokenizer.encode(start, add_special_tokens=False) if start else prefix for start in starts]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            batch = []
            for i, start, out in zip(indices, starts, outputs):
                text = (start + out.text).strip()
                keep = out.finish_reason == "stop" and len(text) >= _MIN_CHARS and text not in seen
                seen.add(text)
                batch.append({"i": i, "prompt": text if keep else ""})
            append_rows(path, batch)
            bar.update(len(batch))
    return path


def read_self_prompts(out_dir: pathlib.Path) -> list[Example]:
    """The kept questions as examples (ids `self_prompts:<index>`); none before the stage ran."""
    path = out_dir / SELF_PROMPTS_FILE
    return [Example(f"self_prompts:{r['i']}", ({"role": "user", "content": r["prompt"]},), None)
            for r in _read(path) if r["prompt"]]


def _read(path: pathlib.Path) -> list[dict]:
    """Finished lines in index order, up to a torn last line (an interrupted write)."""
    rows = read_responses(path)  # the same line format rules as responses.jsonl
    ordered = next((n for n, row in enumerate(rows) if row.get("i") != n), len(rows))
    return rows[:ordered]
