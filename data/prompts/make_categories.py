"""Build `categories.jsonl`: prompts in five categories for tuning and checking speculation
(chat, code, math, summarization of long documents, retrieval-style QA over a pasted context).

Made from text available offline and never from the evaluation sets: templates written for this
project (chat, math), functions of Python's own standard library (code: complete a function from
its signature and docstring, or rewrite a function given its full source), and the long
descriptions (README text) that installed packages ship in their `METADATA` files (summarization,
QA; each document is one DOC_CHARS-long section of a description: first the opening section of every
long enough description, then, to have enough, further sections of the longer ones). The committed file is the output on the project's machine; rerunning it elsewhere gives
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

PER_CATEGORY = 32
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
    "My houseplants keep dying even though I water them every day. What might I be doing wrong?",
    "Help me write a short, warm speech for my grandmother's 80th birthday party.",
    "I keep hitting snooze every morning. How can I become an early riser?",
    "Plan a relaxed two-day weekend in Lisbon for a couple who like good food and long walks.",
    "How do I tell my manager that I have too much work without sounding like I'm complaining?",
    "Suggest five board games for a family with kids aged 8 and 12.",
    "I just moved to a city where I don't know anyone. How can I make new friends?",
    "What is a simple way to start keeping a personal budget?",
    "Write a thank-you note to a teacher who helped my son through a difficult school year.",
    "How should I prepare my car for a long road trip in winter?",
    "I want to learn to cook. Which five basic dishes should I master first, and why?",
    "My teenage daughter is on her phone all the time. How can I talk to her about it without starting a fight?",
    "Give me birthday present ideas under 30 dollars for a colleague who loves coffee.",
    "Any tips for getting some sleep on a long overnight flight?",
    "The blender I bought broke after two weeks. Draft a short email asking the shop for a refund.",
    "I get nervous whenever I have to speak up in meetings. What can I do about it?",
    "What should I pack for a three-day camping trip in the mountains in early autumn?",
    "How can I waste less food in my kitchen?",
    "Recommend a simple stretching routine for someone who sits at a desk all day.",
    "My roommate never does the dishes. How do I bring it up without making things awkward?",
]
CODE_FUNCTIONS = [
    ("textwrap", "dedent"), ("textwrap", "indent"), ("shlex", "quote"), ("html", "escape"),
    ("fnmatch", "translate"), ("calendar", "isleap"), ("heapq", "nlargest"), ("statistics", "median"),
    ("string", "capwords"), ("colorsys", "rgb_to_hls"), ("difflib", "get_close_matches"), ("base64", "b64encode"),
    ("textwrap", "shorten"), ("shlex", "split"), ("statistics", "quantiles"), ("calendar", "monthrange"),
    ("difflib", "unified_diff"), ("fnmatch", "filter"), ("html", "unescape"), ("statistics", "mode"),
    ("glob", "glob"), ("email.utils", "formataddr"), ("base64", "b64decode"), ("urllib.parse", "urljoin"),
    ("statistics", "variance"), ("heapq", "nsmallest"), ("ipaddress", "ip_address"), ("textwrap", "wrap"),
    ("secrets", "token_hex"), ("copy", "deepcopy"), ("shutil", "which"), ("statistics", "harmonic_mean"),
]
MATH = [
    "A shop sells pencils at {a} cents each and notebooks at {b} cents each. Sam buys {c} pencils and {d} notebooks. How much does he pay, in dollars?",
    "A train leaves at {h}:00 and travels {a} km at {b} km per hour. At what time does it arrive?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "Lena saves {a} dollars a week. How many weeks does she need to save {c}00 dollars?",
    "A recipe for {c} people needs {a} grams of flour. How much flour is needed for {d} people?",
    "There are {a} students in a school; {b} percent of them walk to school. How many students do not walk?",
    "A tank holds {a} litres of water and leaks {c} litres per hour. After how many hours does it hold half as much?",
    "A bike costs {a}0 dollars and is on sale for {b} percent off. What is the sale price?",
    "A car uses {c} litres of fuel per 100 km. How much fuel does a {a}0 km trip take, and what does it cost at 1.{d}0 dollars per litre?",
    "A bag holds {c} red, {d} blue and {b} green marbles. One marble is drawn at random. What is the probability that it is not green?",
    "A phone plan costs {b} dollars a month plus {c} cents per text message. What is the bill for a month with {a}0 messages?",
    "A square garden with sides of {c} metres is surrounded by a path {d}0 cm wide. What is the area of the path?",
    "Anna reads {b} pages a day. How many days does she need to finish a book of {a}0 pages?",
    "{a}00 dollars are invested at {c} percent simple interest per year. How much interest do they earn in {d} years?",
    "Two cars start {a}0 km apart and drive towards each other at {b} km/h and {d}0 km/h. After how long do they meet?",
    "A jacket costs {a} dollars. Its price rises by {b} percent and then falls by {b} percent. What is the final price, and why is it not {a} dollars?",
]
QUESTIONS = [
    "How do you install this package, according to the document?",
    "What are the main features the document lists?",
    "What problem does this project solve, according to the document?",
    "Which other projects or tools does the document mention, and why?",
    "According to the document, what does a minimal example of using it look like?",
    "What requirements or dependencies does the document mention?",
    "What limitations, caveats or warnings does the document mention?",
    "Which functions, classes, options or commands does the document name, and what does each do?",
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


def descriptions() -> dict[str, str]:
    """Long description of each installed package with at least DOC_CHARS of text, by name."""
    docs = {}
    for dist in importlib.metadata.distributions():
        text = dist.read_text("METADATA") or ""
        body = email.message_from_string(text).get_payload()
        if isinstance(body, str) and len(body) >= DOC_CHARS:
            docs[dist.metadata["Name"].lower()] = body
    return docs


def sections(body: str) -> list[str]:
    """The DOC_CHARS-long sections of a description, without overlap: the first starts at its beginning,
    each next one at the first line that starts where the one before ends or later; a rest shorter than
    DOC_CHARS is dropped."""
    out, end = [body[:DOC_CHARS]], DOC_CHARS
    while (start := body.find("\n", end - 1) + 1) and len(body) - start >= DOC_CHARS:
        out.append(body[start : start + DOC_CHARS])
        end = start + DOC_CHARS
    return out


def main() -> None:
    rng = random.Random(0)
    bodies = {name: sections(body) for name, body in sorted(descriptions().items())}
    # Opening sections of every package in shuffled order, then second sections by package name, then third, ...
    docs = [secs[0] for secs in bodies.values()]
    rng.shuffle(docs)
    docs += [secs[k] for k in range(1, max(map(len, bodies.values()), default=1)) for secs in bodies.values() if k < len(secs)]
    docs = list(dict.fromkeys(docs))
    if len(docs) < 2 * PER_CATEGORY:
        raise SystemExit(f"need {2 * PER_CATEGORY} sections of long package descriptions, found {len(docs)}")
    # Alternate the documents between the two categories, so both get opening and later sections.
    summaries = [f"Summarize the following document in a few paragraphs.\n\n{text}" for text in docs[0 : 2 * PER_CATEGORY : 2]]
    qa = [
        f"Read the document below and answer the question.\n\nDocument:\n{text}\n\nQuestion: {QUESTIONS[i % len(QUESTIONS)]}"
        for i, text in enumerate(docs[1 : 2 * PER_CATEGORY : 2])
    ]
    sets = {"chat": CHAT, "code": code_prompts(rng), "math": math_prompts(rng), "summarization": summaries, "qa": qa}
    rows = [{"id": f"{c}-{i}", "category": c, "prompt": p} for c, ps in sets.items() for i, p in enumerate(ps)]
    path = pathlib.Path(__file__).with_name("categories.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {path}: " + ", ".join(f"{c} {len(ps)}" for c, ps in sets.items()))


if __name__ == "__main__":
    main()
