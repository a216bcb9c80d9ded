"""Loss curves: one CSV row per logged step (`train_log.csv`), plotted to PNG with matplotlib."""

from __future__ import annotations

import csv
import pathlib


class CurveLog:
    """Appends rows to a CSV; on resume, rows past the checkpoint's step are dropped first."""

    def __init__(self, path: pathlib.Path, resume_step: int) -> None:
        self.path = path
        rows = read_curve(path) if path.exists() and resume_step > 0 else []
        self.rows = [r for r in rows if int(r["step"]) <= resume_step]
        self._rewrite()

    def append(self, row: dict) -> None:
        row = {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
        self.rows.append(row)
        if len(self.rows) == 1 or list(row) != list(self.rows[0]):
            self._rewrite()
            return
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=list(row)).writerow(row)

    def _rewrite(self) -> None:
        with self.path.open("w", newline="") as f:
            if self.rows:
                writer = csv.DictWriter(f, fieldnames=list(self.rows[-1]))
                writer.writeheader()
                writer.writerows(self.rows)


def read_curve(path: pathlib.Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def plot_curves(runs: dict[str, pathlib.Path], png: pathlib.Path, column: str = "ce_1", smooth: int = 20) -> None:
    """One line per run (label -> CSV): `column` against step, a running mean over `smooth` rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, path in runs.items():
        rows = [r for r in read_curve(path) if r.get(column) not in (None, "")]
        steps = [int(r["step"]) for r in rows]
        values = _running_mean([float(r[column]) for r in rows], smooth)
        ax.plot(steps, values, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(column)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _running_mean(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out
