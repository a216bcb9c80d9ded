"""`speculant bench` plots: speedup by category, acceptance by position, throughput vs batch size."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from speculant.bench.report import ALL  # noqa: E402


def write_plots(rows: list[dict], out: pathlib.Path, title: str) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "speedup_by_category.png", out / "acceptance_by_position.png", out / "throughput_vs_batch.png"]
    for path, draw in zip(paths, (_speedup_by_category, _acceptance_by_position, _throughput_vs_batch)):
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax, rows)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths


def _speedup_by_category(ax, rows: list[dict]) -> None:
    """Speedup over `none` per category, at the smallest batch size."""
    batch = min(r["batch"] for r in rows)
    sel = [r for r in rows if r["batch"] == batch and r["method"] != "none" and r["speedup"] is not None]
    methods = sorted({r["method"] for r in sel})
    categories = [ALL] + sorted({r["category"] for r in sel} - {ALL})
    width = 0.8 / max(len(methods), 1)
    for j, m in enumerate(methods):
        by_cat = {r["category"]: r["speedup"] for r in sel if r["method"] == m}
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(categories))]
        ax.bar(xs, [by_cat.get(c, 0.0) for c in categories], width, label=m)
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"speedup over none (batch {batch})")
    _legend(ax)


def _acceptance_by_position(ax, rows: list[dict]) -> None:
    for r in rows:
        if r["category"] == ALL and r.get("acceptance_by_position"):
            acc = r["acceptance_by_position"]
            tau = f", τ={r['tau']:.2f}" if r["tau"] else ""
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{r['method']} batch {r['batch']}{tau}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    _legend(ax)


def _throughput_vs_batch(ax, rows: list[dict]) -> None:
    for m in sorted({r["method"] for r in rows}):
        sel = sorted((r for r in rows if r["method"] == m and r["category"] == ALL), key=lambda r: r["batch"])
        if sel and "throughput_tok_s" in sel[0]:
            ax.plot([r["batch"] for r in sel], [r["throughput_tok_s"] for r in sel], marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens/s (all requests)")
    _legend(ax)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
