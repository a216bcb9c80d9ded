"""Time per product of the real models' weight shapes, for every kernel, at verification sizes.

    python -m speculant.bench.kernels [--models smollm2-135m qwen2.5-coder-1.5b] [--rows 1 2 5 16]
                                      [--repeats 20]

Per model: its gate/up weight and the sum of one layer's four products (qkv, o, gate/up, down).
Columns: `F.linear`; `speculant` (the dense layer with the kernel measured for each row bucket);
the dense kernels it chooses from (`mm` = W @ x^T, `rowsplit` = one bmm batch of rows per thread,
`onednn` = oneDNN inner product on a pre-packed weight, `mkl` = MKL packed GEMM packed for that
row count); `bf16`, the dense layer over the weight rounded to bf16 (its kernel measured per
bucket: native bf16 products or the weight widened to fp32); and the quantized layers (bf16
activations). All kernels take turns in every repeat
(interleaved), so load from other processes hits them alike, and each product starts with the
weight evicted from the CPU caches, as in a forward; each cell is the median in ms, and
a second table gives the minimum (on a shared machine, the figure preemption spoils least).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from speculant.bench.common import machine, print_table, write_json
from speculant.layers import autotune
from speculant.layers.linear import DenseLinear, Int4Linear, Int8Linear
from speculant.layers.quant import quantize_int4, quantize_int8

# (hidden, intermediate, q_size + 2 * kv_size) of the models' products.
SHAPES = {
    "smollm2-135m": (576, 1536, 960),
    "qwen2.5-coder-0.5b": (896, 4864, 1152),
    "qwen2.5-coder-1.5b": (1536, 8960, 2048),
}
Product = Callable[[torch.Tensor], torch.Tensor]


def layer_weights(model: str) -> dict[str, torch.Tensor]:
    hidden, inter, qkv = SHAPES[model]
    shapes = {"qkv": (qkv, hidden), "o": (hidden, hidden), "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
    return {name: torch.randn(shape) / shape[1] ** 0.5 for name, shape in shapes.items()}


def kernels(w: torch.Tensor, rows: list[int]) -> dict[str, Callable[[int], Product]]:
    """column -> (rows -> product); built once per weight, packed forms included."""
    dense, onednn = DenseLinear(w), torch.ops.mkldnn._reorder_linear_weight(w, None)
    int8, int4 = Int8Linear(quantize_int8(w)), Int4Linear(quantize_int4(w))
    columns = {
        "F.linear": lambda m: lambda x: F.linear(x, w),
        "speculant": lambda m: dense,
        "mm": lambda m: lambda x: autotune.run("mm", x, w, None, None),
        "rowsplit": lambda m: lambda x: autotune.run("rowsplit", x, w, None, None),
        "onednn": lambda m: lambda x: autotune.run("onednn", x, w, onednn, None),
    }
    if hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"):
        mkl = {m: torch.ops.mkl._mkl_reorder_linear_weight(w, m) for m in rows}
        columns["mkl"] = lambda m: lambda x: torch.ops.mkl._mkl_linear(x, mkl[m], w, None, m)
    bf16 = DenseLinear(w.bfloat16())  # its kernels measured per bucket like fp32's, widening included
    columns["bf16"] = lambda m: bf16
    columns["int8"] = lambda m: int8
    columns["int4"] = lambda m: int4
    return columns


def time_products(weights: list[torch.Tensor], rows: list[int], repeats: int) -> dict[str, dict]:
    """stat ("median", "min") -> rows -> column -> ms of the summed products over `weights`."""
    per_weight = [kernels(w, rows) for w in weights]
    names = list(per_weight[0])
    result: dict[str, dict] = {"median": {}, "min": {}}
    for m in rows:
        x = [torch.randn(m, w.shape[1]) for w in weights]
        fns = {n: [k[n](m) for k in per_weight] for n in names}
        samples: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(repeats + 1):  # the first round warms up
            for n in names:
                elapsed = 0.0
                for fn, xi in zip(fns[n], x):
                    autotune.flush_cache()  # each weight comes from memory, as in a forward
                    start = time.perf_counter()
                    fn(xi)
                    elapsed += time.perf_counter() - start
                samples[n].append(elapsed)
        result["median"][m] = {n: 1e3 * statistics.median(s[1:]) for n, s in samples.items()}
        result["min"][m] = {n: 1e3 * min(s[1:]) for n, s in samples.items()}
    return result


DENSE = ("F.linear", "speculant", "mm", "rowsplit", "onednn", "mkl")


def table_rows(times: dict[int, dict[str, float]]) -> list[dict]:
    """Adds the verification cost ratios: speculant's M rows over its 1 row, and the fastest fp32
    kernel at M over the fastest fp32 kernel at 1 (so a slow 1-row choice cannot flatter it)."""
    one = times[min(times)]
    best_one = min(v for k, v in one.items() if k in DENSE)
    rows = []
    for m, cells in times.items():
        row = {"rows": m, **cells}
        row["speculant/1-row"] = f"{cells['speculant'] / one['speculant']:.2f}x"
        row["best fp32/1-row"] = f"{min(v for k, v in cells.items() if k in DENSE) / best_one:.2f}x"
        row["bf16/1-row"] = f"{cells['bf16'] / one['bf16']:.2f}x"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-1.5b"], choices=list(SHAPES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 16])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="results/bench_kernels.json")
    args = ap.parse_args(argv)
    report = {"machine": machine(), "repeats": args.repeats, "tables": {}}
    for model in args.models:
        weights = layer_weights(model)
        for label, chosen in (("gate_up", [weights["gate_up"]]), ("one layer", list(weights.values()))):
            shape = " + ".join("x".join(map(str, w.shape)) for w in chosen)
            timed = time_products(chosen, args.rows, args.repeats)
            for stat, times in timed.items():
                print(f"\n{model}, {label} ({shape} fp32), ms per product, {stat} of {args.repeats}")
                rows = table_rows(times)
                columns = ["rows", *times[args.rows[0]], "speculant/1-row", "best fp32/1-row", "bf16/1-row"]
                report["tables"][f"{model} {label} {stat}"] = {"rows": rows, "table": print_table(rows, columns)}
    report["choices"] = {k: v for k, v in autotune._memo.items()}
    report["command"] = "python -m speculant.bench.kernels " + " ".join(argv or [])
    write_json(args.out, report)


if __name__ == "__main__":
    main()
