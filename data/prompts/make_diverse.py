"""Build `diverse.jsonl`: chat prompts of many kinds for self-distilling draft heads.

Templates x subjects written for this project (no evaluation set is used), so a head trained on
the target's own answers sees writing, role play, reasoning, coding, extraction, science and
humanities, not math word problems alone. Deterministic: `python data/prompts/make_diverse.py`.
"""

from __future__ import annotations

import json
import pathlib
import random

SUBJECTS = [
    "the water cycle", "volcanoes", "honey bees", "the Roman Empire", "black holes", "photosynthesis",
    "the printing press", "electric cars", "coral reefs", "the French Revolution", "machine learning",
    "the human heart", "jazz music", "the Silk Road", "climate change", "vaccines", "the moon landing",
    "chess", "renewable energy", "ancient Egypt", "the immune system", "earthquakes", "coffee",
    "the internet", "Shakespeare", "plate tectonics", "recycling", "the Renaissance", "sleep",
    "rainforests", "democracy", "the periodic table", "bicycles", "the Great Wall of China",
    "antibiotics", "social media", "the stock market", "origami", "tea ceremonies", "glaciers",
    "the Industrial Revolution", "DNA", "public libraries", "hurricanes", "the Olympic Games",
    "solar panels", "gardening", "the Cold War", "robots", "volunteering",
]
ROLES = [
    "a ship captain", "a detective", "a medieval baker", "a museum guide", "a football coach",
    "a space station engineer", "a kindergarten teacher", "a travel agent", "a chef", "a park ranger",
]
FUNCTIONS = [
    "reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
    "merges two sorted lists", "returns the n-th Fibonacci number", "removes duplicates from a list",
    "finds the longest word in a sentence", "converts Celsius to Fahrenheit", "flattens a nested list",
    "checks whether a string is a palindrome", "computes the average of a list of numbers",
    "returns the most common element of a list", "parses a date in YYYY-MM-DD format",
    "capitalizes every word in a sentence", "computes the factorial of n", "sorts a list of dictionaries by a key",
]
PASSAGES = [
    "Maria Lopez opened her bakery on Elm Street in 2015. Her brother Daniel joined in 2018, and by 2021 the shop employed six people and sold 400 loaves a day.",
    "The meeting on March 3 was attended by Dr. Chen, Professor Okafor and two students. They agreed to publish the survey results in June and to apply for a grant in September.",
    "Our hiking club walked 14 kilometers on Saturday, starting at Pine Lake at 8 a.m. and reaching Eagle Peak by noon. Anna, Tom and Priya led the three groups.",
    "The city council approved a new bike lane on Main Avenue. Construction starts in April, costs 2.3 million dollars and should finish before the end of the year.",
    "In 1969, Neil Armstrong and Buzz Aldrin landed on the Moon while Michael Collins orbited above in the command module Columbia.",
    "The quarterly report shows revenue of 12 million euros, up 8 percent, while costs rose 5 percent. The company plans to open offices in Lisbon and Warsaw.",
]
TEMPLATES = {
    "writing": [
        "Write a short poem about {s}.", "Write a blog post introduction about {s}.",
        "Write a persuasive paragraph on why people should learn about {s}.",
        "Write a short story for children that involves {s}.", "Write a product description inspired by {s}.",
    ],
    "roleplay": [
        "Pretend you are {r}. Describe a typical day at work.", "You are {r}. Give advice to someone starting out in your job.",
        "Imagine you are {r} and explain {s} to a visitor.",
    ],
    "reasoning": [
        "What are the pros and cons of {s}?", "Why does {s} matter today? Give three reasons.",
        "Compare {s} and {s2}. How are they similar and how are they different?",
        "If you had to teach {s} in one hour, how would you plan the lesson?",
    ],
    "stem": [
        "Explain {s} to a high school student.", "What are the most common misconceptions about {s}?",
        "Describe how {s} works, step by step.",
    ],
    "humanities": [
        "Summarize the history of {s} in a few paragraphs.", "How has {s} influenced culture and society?",
    ],
    "coding": [
        "Write a Python function that {f}.", "Write a Python function that {f}, and explain how it works.",
        "Write a JavaScript function that {f}.", "Write unit tests in Python for a function that {f}.",
    ],
    "extraction": [
        "Extract every name and date from this text: {p}", "Summarize this text in one sentence: {p}",
        "List the numbers mentioned in this text and what they refer to: {p}",
        "Turn this text into a JSON object with the key facts: {p}",
    ],
}


def prompts(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for category, templates in TEMPLATES.items():
        for template in templates:
            if "{f}" in template:
                fills = [{"f": f} for f in FUNCTIONS]
            elif "{p}" in template:
                fills = [{"p": p} for p in PASSAGES]
            elif "{r}" in template:
                fills = [{"r": r, "s": rng.choice(SUBJECTS)} for r in ROLES]
            else:
                fills = [{"s": s, "s2": rng.choice(SUBJECTS)} for s in SUBJECTS]
            out += [{"category": category, "prompt": template.format(**fill)} for fill in fills]
    rng.shuffle(out)
    return out


if __name__ == "__main__":
    path = pathlib.Path(__file__).with_name("diverse.jsonl")
    rows = prompts()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = {c: sum(r["category"] == c for r in rows) for c in TEMPLATES}
    print(f"wrote {len(rows)} prompts to {path}: {counts}")
