"""The eagle3 ablation plot (docs/head_eagle3_ablation.png): MT-bench acceptance by draft position
(k = 4 chain, fixed k, greedy) of each head, from the bench runs kept beside this file.

    .venv/bin/python results/head_training/eagle3_ablation/plot.py
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent
SWEEP = HERE.parent / "eagle3_sweep"
CHAIN = "mtp:k=4:adaptive_k=false"
ROWS = [  # (label, bench.json, method)
    ("normed (shipped before)", SWEEP / "mtbench_800steps/bench.json", CHAIN),
    ("eagle3, frozen lm_head, 800 steps", SWEEP / "mtbench_frozen_lm_head/bench.json", CHAIN + ":head=runs/frz/train/head"),
    ("eagle3, 800 steps", SWEEP / "mtbench_800steps/bench.json", CHAIN + ":head=runs/lr15/train/head"),
    ("eagle3, 1,800 steps", SWEEP / "mtbench_1800steps/bench.json", CHAIN + ":head=runs/long15/train/head"),
    ("+ unroll 2 (training-time test)", SWEEP / "mtbench_ttt/bench.json", CHAIN + ":head=runs/ttt/train/head"),
    ("+ 2.8x the data, 1,500 + 200 steps (shipped)", HERE / "mtbench_shipped/bench.json", CHAIN),
]


def acceptance(path: pathlib.Path, method: str) -> tuple[list[float], float]:
    rows = json.loads(path.read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    (row,) = [r for r in rows if r["category"] == "all" and r["method"] == method]
    return row["acceptance_by_position"], row["tau"]


def main() -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(ROWS)
    for n, (label, path, method) in enumerate(ROWS):
        acc, tau = acceptance(path, method)
        ax.bar([p + 1 + (n - len(ROWS) / 2 + 0.5) * width for p in range(len(acc))], acc, width, label=f"{label} (τ {tau:.2f})")
    ax.set_xlabel("draft position (k = 4 chain)")
    ax.set_ylabel("MT-bench acceptance")
    ax.set_xticks([1, 2, 3, 4])
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = HERE.parents[2] / "docs" / "head_eagle3_ablation.png"
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
