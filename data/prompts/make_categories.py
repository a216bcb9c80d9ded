"""Build `categories.jsonl`: prompts in five categories for tuning and checking speculation
(chat, code, math, summarization of long documents, retrieval-style QA over a pasted context).

Made from text available offline and never from the evaluation sets: templates written for this
project (chat, math), functions of Python's own standard library (code: complete a function from
its signature and docstring, or rewrite a function given its full source), and the long
descriptions (README text) that installed packages ship in their `METADATA` files (summarization,
QA). The committed file is the output on the project's machine; rerunning it elsewhere gives
other documents: `python data/prompts/make_categories.py`.
"""

from __future__ import annotations

import email
import importlib
import importlib.metadata
import inspect
import json
import pathlib
import random

PER_CATEGORY = 12
DOC_CHARS = 5000  # a long document: about 1,200-1,500 tokens

CHAT = [
    "I have a job interview next week for a marketing role. How should I prepare?",
    "What are some good habits for staying focused while working from home?",
    "My friend and I disagree about whether to travel by train or plane for a 600 km trip. Help us decide.",
    "Can you suggest a weekly meal plan for a vegetarian on a budget?",
    "How do I politely decline an invitation to a wedding?",
    "What should I consider before adopting a dog?",
    "Explain the difference between saving and investing to a teenager.",
    "I want to start running. Give me a plan for the first month.",
    "How can I make my small apartment feel bigger?",
    "What are good questions to ask at the end of a first date?",
    "Write a friendly message to a neighbour asking them to keep the noise down at night.",
    "How do I keep a conversation going with people I just met at a conference?",
]
CODE_FUNCTIONS = [
    ("textwrap", "dedent"), ("textwrap", "indent"), ("shlex", "quote"), ("html", "escape"),
    ("fnmatch", "translate"), ("calendar", "isleap"), ("heapq", "nlargest"), ("statistics", "median"),
    ("string", "capwords"), ("colorsys", "rgb_to_hls"), ("difflib", "get_close_matches"), ("base64", "b64encode"),
]
MATH = [
    "A shop sells pencils at {a} cents each and notebooks at {b} cents each. Sam buys {c} pencils and {d} notebooks. How much does he pay, in dollars?",
    "A train leaves at {h}:00 and travels {a} km at {b} km per hour. At what time does it arrive?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "Lena saves {a} dollars a week. How many weeks does she need to save {c}00 dollars?",
    "A recipe for {c} people needs {a} grams of flour. How much flour is needed for {d} people?",
    "There are {a} students in a school; {b} percent of them walk to school. How many students do not walk?",
]
QUESTIONS = [
    "How do you install this package, according to the document?",
    "What are the main features the document lists?",
    "What problem does this project solve, according to the document?",
    "Which other projects or tools does the document mention, and why?",
    "According to the document, what does a minimal example of using it look like?",
    "What requirements or dependencies does the document mention?",
]


def code_prompts(rng: random.Random) -> list[str]:
    out = []
    for n, (module, name) in enumerate(CODE_FUNCTIONS):
        fn = getattr(importlib.import_module(module), name)
        source = inspect.getsource(fn)
        if n % 2 == 0:
            doc = inspect.getdoc(fn) or ""
            stub = f"def {name}{inspect.signature(fn)}:\n    \"\"\"{doc}\"\"\"\n"
            out.append(f"Complete the following Python function.\n\n```python\n{stub}```")
        else:
            out.append(f"Rewrite this Python function with type hints and a comment on every line.\n\n```python\n{source}```")
    return out


def math_prompts(rng: random.Random) -> list[str]:
    out = []
    for i in range(PER_CATEGORY):
        t = MATH[i % len(MATH)]
        out.append(t.format(a=rng.randint(12, 95), b=rng.randint(3, 60), c=rng.randint(2, 9), d=rng.randint(2, 9), h=rng.randint(6, 18)))
    return out


def documents() -> list[tuple[str, str]]:
    """(package, long description) of installed packages with at least DOC_CHARS of text, by name."""
    docs = {}
    for dist in importlib.metadata.distributions():
        text = dist.read_text("METADATA") or ""
        body = email.message_from_string(text).get_payload()
        if isinstance(body, str) and len(body) >= DOC_CHARS:
            docs[dist.metadata["Name"].lower()] = body[:DOC_CHARS]
    return sorted(docs.items())


def main() -> None:
    rng = random.Random(0)
    docs = documents()
    rng.shuffle(docs)
    if len(docs) < 2 * PER_CATEGORY:
        raise SystemExit(f"need {2 * PER_CATEGORY} installed packages with long descriptions, found {len(docs)}")
    summaries = [f"Summarize the following document in a few paragraphs.\n\n{text}" for _, text in docs[:PER_CATEGORY]]
    qa = [
        f"Read the document below and answer the question.\n\nDocument:\n{text}\n\nQuestion: {QUESTIONS[i % len(QUESTIONS)]}"
        for i, (_, text) in enumerate(docs[PER_CATEGORY : 2 * PER_CATEGORY])
    ]
    sets = {"chat": CHAT, "code": code_prompts(rng), "math": math_prompts(rng), "summarization": summaries, "qa": qa}
    rows = [{"id": f"{c}-{i}", "category": c, "prompt": p} for c, ps in sets.items() for i, p in enumerate(ps)]
    path = pathlib.Path(__file__).with_name("categories.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {path}: " + ", ".join(f"{c} {len(ps)}" for c, ps in sets.items()))


if __name__ == "__main__":
    main()
