"""Build passage tasks: chat prompts that hand the model a text to rework (rewrite, extract,
summarize, tabulate, correct), for self-distilling draft heads on answers that copy from the prompt.

Passages are GSM8K train questions (short texts full of names and numbers), each used once, past
the first `--skip` (the questions the shipped head's data already holds as questions); templates
written for this project, no evaluation set. Deterministic:
`python data/prompts/make_passage_tasks.py ../shared/data/train/gsm8k_train.jsonl runs/passage_tasks.jsonl`
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

TEMPLATES = [
    "Rewrite this text in simpler words: {p}",
    "Rewrite this text in a formal tone: {p}",
    "Rewrite this text in the past tense: {p}",
    "Extract every name and number from this text: {p}",
    "List the people and objects mentioned in this text: {p}",
    "Summarize this text in one sentence: {p}",
    "Turn this text into a JSON object with the key facts: {p}",
    "List the facts of this text as bullet points: {p}",
    "Write a short title for this text, then the text itself as a paragraph: {p}",
    "Correct any spelling or grammar mistakes in this text and return it: {p}",
    "Turn this text into a short dialogue between two people: {p}",
    "Make a Markdown table of the quantities in this text, with a column for what each one counts: {p}",
    "Translate this text into French: {p}",
    "Which sentence of this text holds the question? Quote it: {p}",
    "Compare these two texts. What do they have in common? Text 1: {p} Text 2: {p2}",
]


def tasks(questions: list[str], count: int, seed: int = 0) -> list[dict]:
    """`count` prompts, templates taken in turn, each question a passage once (a two-text template
    takes the next question as its second)."""
    rng = random.Random(seed)
    order = list(range(len(questions)))
    rng.shuffle(order)
    passages, out = iter(questions[i] for i in order), []
    for n in range(count):
        template = TEMPLATES[n % len(TEMPLATES)]
        texts = {name: next(passages, None) for name in ("p", "p2") if "{" + name + "}" in template}
        if None in texts.values():  # the passages ran out
            break
        out.append({"category": "passage", "prompt": template.format(**texts)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gsm8k", type=pathlib.Path, help="gsm8k_train.jsonl (question/answer lines)")
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--skip", type=int, default=1200, help="leave out the first N questions")
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    lines = args.gsm8k.read_text(encoding="utf-8").splitlines()[args.skip:]
    questions = [json.loads(line)["question"].strip() for line in lines if line.strip()]
    rows = tasks(questions, args.count)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {args.out} from {len(questions)} passages")


if __name__ == "__main__":
    main()
