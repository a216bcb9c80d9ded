"""Where one forward's time goes, by kind of work, at verification sizes.

    python -m speculant.bench.step_profile [--model smollm2-135m] [--weights auto] [--context 300]
                                           [--rows 1 2 5 8] [--repeats 10] [--threads 1]
                                           [--output results/step_profile.json]

Prefills `--context` tokens, then runs forwards of M new tokens after them (logits for every
row, as a verification computes) and charges the process's CPU time to the quantized products
(int4 groups, int8 rows), the dense products, attention (the backend's forward, K/V writes
included) and everything else (norms, RoPE, activations, embedding, the attention plan, Python).
CPU time rather than wall time: on a shared machine it is what other processes disturb least;
with `--threads 1` it is also the work one core does. Minimum over repeats, in ms. `step` is the
forward as it runs (the native decoder stack, one call for all layers, where it fits); the
breakdown times the same forward run layer by layer from Python (`total`), whose per-op dispatch
the stack saves. `M/1` is a step's time over the one-row step's. `wall` is the stacked forward's
wall time (minimum over repeats) and `wall M/1` its ratio: with two threads, the cost a
verification of M rows adds to a user's step, which CPU time alone does not show (a memory-bound
one-row product leaves a core waiting, uncounted).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time

import torch

from speculant.bench.common import git_commit, machine, print_table, write_json

KINDS = ("int4", "int8", "dense", "attention", "other")
totals: dict = collections.defaultdict(float)  # CPU seconds per kind, charged by the wrapped calls


def _charge(totals: dict, cls, method: str, kind: str) -> None:
    inner = getattr(cls, method)

    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[kind] += time.process_time() - start

    setattr(cls, method, timed)


def profile(llm, context: int, rows: list[int], repeats: int) -> list[dict]:
    from speculant.attention.batch import SeqInput
    from speculant.executor.plan import TARGET, ForwardPlan

    executor, allocator, page_size = llm.engine.executor, llm.engine.pages.allocator, llm.engine.pages.page_size
    pages = allocator.allocate(-(-(context + max(rows)) // page_size))
    forward = lambda inputs: executor.run(ForwardPlan(TARGET, inputs))  # noqa: E731
    forward([SeqInput(list(range(100, 100 + context)), 0, pages)])
    out = []
    for m in rows:
        step = lambda m=m: forward([SeqInput(list(range(500, 500 + m)), context, pages, logits="all")])  # noqa: E731
        runs = [_cpu_and_wall(step) for _ in range(repeats)]  # as it runs: the native stack where it fits
        stacked, wall = min(cpu for cpu, _ in runs), min(w for _, w in runs)
        best: dict | None = None
        with _layer_loop():  # the same forward op by op, so that each kind's calls can be timed
            for _ in range(repeats):
                totals.clear()
                sample = {"total": _cpu_time(step), **{k: totals[k] for k in KINDS[:-1]}}
                if best is None or sample["total"] < best["total"]:
                    best = sample
        best["other"] = best["total"] - sum(best[k] for k in KINDS[:-1])
        out.append({"rows": m, "step": round(stacked * 1e3, 2), "wall": round(wall * 1e3, 2), **{k: round(v * 1e3, 2) for k, v in best.items()}})
    allocator.free(pages)
    for row in out:
        row["M/1"] = round(row["step"] / out[0]["step"], 2)
        row["wall M/1"] = round(row["wall"] / out[0]["wall"], 2)
    return out


def _cpu_time(fn) -> float:
    return _cpu_and_wall(fn)[0]


def _cpu_and_wall(fn) -> tuple[float, float]:
    start, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - start, time.perf_counter() - wall


@contextlib.contextmanager
def _layer_loop():
    from speculant.models import native_stack

    runs = native_stack.runs
    native_stack.runs = lambda ctx, x: False
    try:
        yield
    finally:
        native_stack.runs = runs



def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    from speculant.attention.native_backend import NativeAttention
    from speculant.layers.linear import DenseLinear, Int4Linear, Int8Linear
    from speculant.llm import LLM

    for cls, kind in ((Int4Linear, "int4"), (Int8Linear, "int8"), (DenseLinear, "dense")):
        _charge(totals, cls, "__call__", kind)
    _charge(totals, NativeAttention, "forward", "attention")
    llm = LLM(model=args.model, weights=args.weights, speculative="none")
    torch.set_num_threads(args.threads)
    result = profile(llm, args.context, args.rows, args.repeats)
    print_table(result, ["rows", "step", "total", *KINDS, "M/1", "wall", "wall M/1"])
    if args.output:
        write_json(args.output, {"args": vars(args), "commit": git_commit(), "machine": machine(), "forwards": result})
    return result


if __name__ == "__main__":
    main()
