"""End-to-end mode of `python -m speculant.bench.llamacpp --dataset ...`: whole requests, prefill
included, per category; each system given the same prompt token ids.

A runner takes (prompt ids, new tokens) and returns (seconds, generated ids). Each request is
timed by every system in turn (interleaved, so load spikes from other users of the cores hit
all of them), --repeats times; a request's time is the median of its repeats, its rate
new tokens / time. Per category and overall: the median of the requests' rates, and that
median over llama.cpp plain's.
"""

from __future__ import annotations

import pathlib
import statistics
import time
from collections.abc import Callable

from speculant.bench.common import data_dir
from speculant.bench.datasets import Conversation, load_dataset, select

E2ERunner = Callable[[list[int], int], tuple[float, list[int]]]
DATASETS = ("mt_bench", "categories", "humaneval")
REFERENCE = "llama.cpp plain"


def dataset_path(name: str) -> pathlib.Path:
    """A named prompt set (MT-bench and HumanEval beside the checkout, the categories set in the
    repo), or any JSONL path that `speculant.bench.datasets` reads."""
    if name == "mt_bench":
        return data_dir() / "mt_bench" / "question.jsonl"
    if name == "humaneval":
        return data_dir() / "humaneval" / "HumanEval.jsonl.gz"
    if name == "categories":
        return pathlib.Path(__file__).resolve().parents[2] / "data" / "prompts" / "categories.jsonl"
    return pathlib.Path(name)


def load_items(name: str, n: int | None) -> list[Conversation]:
    """n items round-robin over categories; multi-turn items keep their first turn only."""
    items = select(load_dataset(dataset_path(name)), n)
    return [Conversation(i.id, i.category, i.turns[:1], i.chat) for i in items]


def prompt_ids(tokenizer, item: Conversation) -> list[int]:
    """The item's first turn in the model's chat template (raw text for completion items)."""
    from speculant.bench.suite import turn_messages

    return turn_messages(tokenizer, item, [], 0)


def speculant_e2e(llm) -> E2ERunner:
    from speculant.sampling.params import SamplingParams

    def run(ids: list[int], n: int) -> tuple[float, list[int]]:
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        out = llm.generate([ids], params)[0]
        return time.perf_counter() - start, list(out.token_ids)

    return run


def llamacpp_e2e(llm) -> E2ERunner:
    """A `llama_cpp.Llama`: its generator, greedy, EOS masked; the cache reset before each request
    so it prefills every prompt as speculant does."""
    import numpy as np
    from llama_cpp import LogitsProcessorList

    eos = llm.token_eos()

    def no_eos(_ids, scores):
        scores[eos] = -np.inf
        return scores

    def run(ids: list[int], n: int) -> tuple[float, list[int]]:
        llm.reset()
        out: list[int] = []
        start = time.perf_counter()
        gen = llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, logits_processor=LogitsProcessorList([no_eos]))
        for token in gen:
            out.append(int(token))
            if len(out) == n:
                break
        gen.close()
        return time.perf_counter() - start, out

    return run


def measure(runners: dict[str, E2ERunner], items: list[Conversation], prompts: list[list[int]], n: int,
            repeats: int, warmup: bool = True) -> dict:
    """Per system and request: median seconds over the repeats, and the first repeat's ids."""
    if warmup and prompts:
        for run in runners.values():
            run(prompts[0], min(n, 8))
    seconds: dict[str, list[list[float]]] = {s: [[] for _ in prompts] for s in runners}
    ids: dict[str, list[list[int]]] = {s: [[] for _ in prompts] for s in runners}
    for r in range(repeats):
        for i, p in enumerate(prompts):
            for name, run in runners.items():
                t, out = run(p, n)
                seconds[name][i].append(t)
                if r == 0:
                    ids[name][i] = out
    requests = []
    for i, (item, p) in enumerate(zip(items, prompts)):
        row = {"id": item.id, "category": item.category, "prompt_tokens": len(p), "systems": {}}
        for name in runners:
            t = statistics.median(seconds[name][i])
            row["systems"][name] = {"seconds": t, "tok_s": len(ids[name][i]) / t, "new_tokens": len(ids[name][i]),
                                    "all_seconds": seconds[name][i]}
        requests.append(row)
    return {"requests": requests, "ids": ids}


def summarize(requests: list[dict], systems: list[str], reference: str = REFERENCE) -> list[dict]:
    """One row per system: median tok/s per category and overall, each over the reference's."""
    categories = list(dict.fromkeys(r["category"] for r in requests))
    groups = {c: [r for r in requests if r["category"] == c] for c in categories}
    groups["overall"] = requests
    medians = {s: {c: statistics.median(r["systems"][s]["tok_s"] for r in g) for c, g in groups.items()} for s in systems}
    rows = []
    for s in systems:
        row = {"system": s}
        for c in groups:
            ref = medians.get(reference, {}).get(c)
            row[c] = medians[s][c]
            row[f"{c}_ratio"] = medians[s][c] / ref if ref else None
        rows.append(row)
    return rows


def agreement(ids: dict[str, list[list[int]]], reference: str = REFERENCE) -> dict[str, str]:
    """Per system: requests whose greedy ids equal the reference's, as "k/n"."""
    ref = ids.get(reference)
    if ref is None:
        return {}
    return {s: f"{sum(a == b for a, b in zip(out, ref))}/{len(ref)}" for s, out in ids.items()}


def markdown(rows: list[dict], same: dict[str, str]) -> str:
    """Tok/s (ratio to llama.cpp plain) per category, overall last."""
    cats = [k for k in rows[0] if k != "system" and not k.endswith("_ratio")]
    lines = ["| system | " + " | ".join(cats) + " | same ids as llama.cpp plain |",
             "|---|" + "---|" * (len(cats) + 1)]
    for row in rows:
        cells = [f"{row[c]:.1f} ({row[c + '_ratio']:.2f}x)" if row[c + "_ratio"] is not None else f"{row[c]:.1f}"
                 for c in cats]
        lines.append(f"| {row['system']} | " + " | ".join(cells) + f" | {same.get(row['system'], '-')} |")
    return "\n".join(lines)
