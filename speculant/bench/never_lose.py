"""Adaptive k against plain decoding and against every fixed k, per category: the tables and the
plot of the README's "Adaptive k never loses", from `speculant bench` runs (one folder per run,
each holding its bench.json).

    python -m speculant.bench.never_lose results/adaptive_k

A batch-1 run holds `none`, fixed-k methods (`ngram:k=4:adaptive_k=false`) and one adaptive method
(`ngram:k=8:adaptive_k=true`) over every category; a batch-16/32 run holds `none` and the adaptive
method over one category's prompts. A batch-1 run may hold only `none` and the adaptive method (more
prompts of a few categories): it is held to plain decoding only. Where runs share a family and
category, the plot shows the last run by name. Speedups compare methods of the same run only.
"""

from __future__ import annotations

import argparse
import json
import pathlib

FLOOR, NEAR_BEST = 0.98, 0.95  # adaptive >= 0.98x plain everywhere; >= 0.95x the best fixed k at batch 1


def parse_method(label: str) -> tuple[str, int | None, bool] | None:
    """`ngram:k=4:adaptive_k=false` -> ("ngram", 4, False); None for `none`."""
    if label == "none":
        return None
    name, *opts = label.split(":")
    options = dict(o.split("=", 1) for o in opts)
    k = int(options["k"]) if "k" in options else None
    return name, k, options.get("adaptive_k", "true").lower() in ("1", "true", "yes")


def load_runs(folder: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) | {"name": p.parent.name} for p in sorted(folder.glob("*/bench.json"))]


def batch1_rows(runs: list[dict]) -> list[dict]:
    """Per method family and category: plain tok/s, each fixed k's and adaptive's speedup."""
    out = []
    for run in runs:
        if run["setup"]["batch_sizes"] != [1]:
            continue
        by_cat: dict[str, dict] = {}
        for row in run["rows"]:
            cell = by_cat.setdefault(row["category"], {"fixed": {}})
            parsed = parse_method(row["method"])
            if parsed is None:
                cell["plain_tok_s"] = row["tok_s"]
                continue
            family, k, adaptive = parsed
            cell["family"] = family
            if adaptive:
                cell.update(adaptive=row["speedup"], adaptive_k_max=k, adaptive_tau=row["tau"], same=row["same_tokens"])
            else:
                cell["fixed"][k] = row["speedup"]
        for category, cell in by_cat.items():  # a run without fixed k's (more prompts of a few categories) has no best
            best_k = max(cell["fixed"], key=cell["fixed"].get) if cell["fixed"] else None
            vs_best = None if best_k is None else cell["adaptive"] / cell["fixed"][best_k]
            out.append({"run": run["name"], "category": category, **cell, "best_k": best_k, "vs_best": vs_best})
    return out


def batched_rows(runs: list[dict]) -> list[dict]:
    """Per method family, batch size and category: throughput of none and adaptive."""
    out = []
    for run in runs:
        sizes = run["setup"]["batch_sizes"]
        if sizes == [1]:
            continue
        rows = [r for r in run["rows"] if r["category"] == "all"]
        for b in sizes:
            plain = next(r for r in rows if r["method"] == "none" and r["batch"] == b)
            for r in rows:
                parsed = parse_method(r["method"])
                if parsed is None or r["batch"] != b or not parsed[2]:
                    continue
                category = ",".join(run["setup"]["categories"] or ["all"])
                out.append({"run": run["name"], "family": parsed[0], "batch": b, "category": category,
                            "plain_tok_s": plain["throughput_tok_s"], "adaptive_tok_s": r["throughput_tok_s"],
                            "ratio": r["throughput_tok_s"] / plain["throughput_tok_s"], "tau": r["tau"], "same": r["same_tokens"]})
    return out


def markdown(b1: list[dict], batched: list[dict]) -> str:
    ks = sorted({k for r in b1 for k in r["fixed"]})
    head = "| method | category | plain tok/s | " + " | ".join(f"k={k}" for k in ks) + " | adaptive | τ | passes | vs best fixed | run |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(b1, key=lambda r: (r["family"], r["category"] != "all", r["category"], r["run"])):
        fixed = " | ".join(f"{r['fixed'][k]:.2f}x" if k in r["fixed"] else "–" for k in ks)
        ok = "✓" if r["adaptive"] >= FLOOR and (r["vs_best"] is None or r["vs_best"] >= NEAR_BEST) else "✗"
        best = "–" if r["vs_best"] is None else f"{r['vs_best']:.2f} (best k={r['best_k']})"
        lines.append(f"| {r['family']} | {r['category']} | {r['plain_tok_s']:.1f} | {fixed} | **{r['adaptive']:.2f}x** "
                     f"(k ≤ {r['adaptive_k_max']}) | {r['adaptive_tau']:.2f} | {ok} | {best} | {r['run']} |")
    lines += ["", "| method | batch | category | plain tok/s | adaptive tok/s | ratio | τ | ≥ 0.98x |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(batched, key=lambda r: (r["family"], r["batch"], r["category"])):
        lines.append(f"| {r['family']} | {r['batch']} | {r['category']} | {r['plain_tok_s']:.1f} | {r['adaptive_tok_s']:.1f} | "
                     f"**{r['ratio']:.3f}x** | {r['tau']:.2f} | {'✓' if r['ratio'] >= FLOOR else '✗'} |")
    return "\n".join(lines)


def plot(b1: list[dict], batched: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({r["family"] for r in b1} | {r["family"] for r in batched})
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
    for ax, family in zip(axes[0], families):
        cats = sorted({r["category"] for r in b1 + batched if r["family"] == family and r["category"] != "all"})
        series = {"batch 1, best fixed k": {r["category"]: r["fixed"][r["best_k"]] for r in b1 if r["family"] == family and r["best_k"] is not None},
                  "batch 1, adaptive": {r["category"]: r["adaptive"] for r in b1 if r["family"] == family}}
        for b in sorted({r["batch"] for r in batched if r["family"] == family}):
            series[f"batch {b}, adaptive"] = {r["category"]: r["ratio"] for r in batched if r["family"] == family and r["batch"] == b}
        width = 0.8 / len(series)
        for i, (label, values) in enumerate(series.items()):
            xs = [j + i * width for j, c in enumerate(cats) if c in values]
            ax.bar(xs, [values[c] for c in cats if c in values], width, label=label)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(FLOOR, color="red", lw=0.8, ls="--", label="0.98x")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats)
        ax.set_ylabel("speedup over plain decoding")
        ax.set_title(family)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=pathlib.Path)
    args = p.parse_args(argv)
    runs = load_runs(args.folder)
    b1, batched = batch1_rows(runs), batched_rows(runs)
    print(markdown(b1, batched))
    plot(b1, batched, args.folder / "never_lose.png")


if __name__ == "__main__":
    main()
