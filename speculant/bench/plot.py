"""Figures from the benchmark JSON files: `python -m speculant.bench.plot` writes results/*.png."""

from __future__ import annotations

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_decode(src: pathlib.Path, out: pathlib.Path) -> None:
    data = json.loads(src.read_text())
    rows = data["rows"]
    labels = [f"batch {r['batch']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([i - 0.2 for i in x], [r["speculant_tok_s"] for r in rows], 0.4, label="speculant")
    ax.bar([i + 0.2 for i in x], [r["transformers_tok_s"] for r in rows], 0.4, label="transformers generate")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"{data['model']}, fp32, 2-core CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_spec(src: pathlib.Path, out: pathlib.Path) -> None:
    data = json.loads(src.read_text())
    rows = data["rows"]
    colors = ["tab:blue" if r["system"] == "speculant" else "tab:orange" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.barh([f"{r['system']}: {r['config']}" for r in rows], [r["speedup"] for r in rows], color=colors)
    ax.axvline(1.0, color="grey", lw=1)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over the same system's target alone")
    ax.set_title(f"{data['target']} + draft {data['draft']}, HumanEval, batch 1", fontsize=9)
    for i, r in enumerate(rows):
        tau = f", τ={r['tau']:.2f}" if r.get("tau") and r["config"] != "target alone" else ""
        ax.text(r["speedup"], i, f" {r['tok_s']:.2f} tok/s{tau}", va="center", fontsize=8)
    ax.set_xlim(0, max(r["speedup"] for r in rows) * 1.45)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    results = pathlib.Path("results")
    if (results / "bench_decode.json").exists():
        plot_decode(results / "bench_decode.json", results / "bench_decode.png")
    if (results / "bench_spec.json").exists():
        plot_spec(results / "bench_spec.json", results / "bench_spec.png")


if __name__ == "__main__":
    main()
