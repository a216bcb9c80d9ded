"""`speculant bench` results: rows per method x batch size x category, a markdown table, JSON, plots."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from speculant.bench.suite import ItemRun, MethodRun
from speculant.engine.stats import mean_k

ALL = "all"
TABLE_COLUMNS = [
    "method", "batch", "category", "requests", "tok_s", "speedup", "tau", "acceptance",
    "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "host_ms_step", "hidden_ms_step",
    "same_tokens",
]


def summarize(runs: list[MethodRun], greedy: bool) -> list[dict]:
    """One row per method x batch size x category (and "all"). `tok_s` is a request's own speed
    (its tokens over its time from submit to finish, summed over the rows' requests); the "all"
    rows also carry `throughput_tok_s`, every token over the run's wall time."""
    reference = {r.batch_size: r for r in runs if r.method == "none"}
    rows = []
    for run in runs:
        categories = sorted({i.item.category for i in run.items})
        for category in [ALL] + categories:
            items = [i for i in run.items if category in (ALL, i.item.category)]
            row = _row(run, category, items)
            ref = reference.get(run.batch_size)
            if category == ALL:
                row["throughput_tok_s"] = row["output_tokens"] / run.wall_s if run.wall_s else 0.0
                row["acceptance_by_position"] = _by_position(run)
                row["chosen_k_histogram"] = {str(k): n for k, n in sorted(run.chosen_k.items())}  # k -> requests given it
                row["mean_k"] = mean_k(run.chosen_k)
                # host scheduling/commit time per engine step, and the part overlap hid behind forwards
                row["host_ms_step"] = 1000 * run.host_stage_s / run.steps if run.steps else None
                row["hidden_ms_step"] = 1000 * run.host_hidden_s / run.steps if run.steps else None
            if greedy and ref is not None and run.method != "none":
                row["same_tokens"] = _same_tokens(items, ref.items)
            rows.append(row)
    _add_speedups(rows)
    return rows


def _row(run: MethodRun, category: str, items: list[ItemRun]) -> dict:
    tokens = sum(len(t) for i in items for t in i.token_ids)
    latency = sum(i.latency_s for i in items)
    forwards = sum(i.target_forwards for i in items)
    drafted = sum(i.draft_tokens for i in items)
    ttft = [t * 1000 for i in items for t in i.ttft_s]
    itl = [t * 1000 for i in items for t in i.itl_s]
    row = {
        "method": run.method, "batch": run.batch_size, "category": category, "requests": len(items),
        "output_tokens": tokens, "tok_s": tokens / latency if latency else 0.0, "speedup": None,
        "tau": tokens / forwards if forwards else None,  # None: not observable (peers)
        "acceptance": sum(i.accepted_tokens for i in items) / drafted if drafted else None,
        "same_tokens": None,
    }
    for name, values in (("ttft", ttft), ("itl", itl)):
        for q in (50, 90, 99):
            row[f"{name}_p{q}_ms"] = float(np.percentile(values, q)) if values else None
    return row


def _by_position(run: MethodRun) -> list[float]:
    return [a / p if p else 0.0 for a, p in zip(run.accepted_by_position, run.proposed_by_position)]


def _same_tokens(items: list[ItemRun], reference: list[ItemRun]) -> bool:
    ref = {i.item.id: i.token_ids for i in reference}
    return all(i.token_ids == ref.get(i.item.id) for i in items)


def _add_speedups(rows: list[dict]) -> None:
    base = {(r["batch"], r["category"]): r["tok_s"] for r in rows if r["method"] == "none"}
    for r in rows:
        b = base.get((r["batch"], r["category"]))
        r["speedup"] = r["tok_s"] / b if b else None


def markdown_table(rows: list[dict], columns: list[str] = TABLE_COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def write_json(path: pathlib.Path, setup: dict, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setup": setup, "rows": rows}, indent=2))
