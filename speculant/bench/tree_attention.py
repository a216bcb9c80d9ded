"""Masked (tree) against causal attention on the same shapes, and the verify cost curve.

    python -m speculant.bench.tree_attention [--model smollm2-135m] [--contexts 256 1024]
                                             [--tokens 1 2 4 8 16 32 64] [--repeats 15]

For each context length and number of verified tokens t: one target forward over t new tokens
after the cached context, laid out as a chain (causal) and as a tree (a random tree of t - 1
nodes under the root, each row seeing its ancestors), through the engine's executor and attention
backend; the two take turns in every repeat. Cells: the fastest repeat in ms (on a shared machine,
the figure preemption spoils least) and the ratio tree / causal; the last column is the
forward's cost relative to t = 1 at that context, the curve the tree budget is chosen from.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from speculant.attention.batch import SeqInput
from speculant.bench.common import machine, print_table
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.sampling import tree_shape


def random_parents(num_nodes: int, seed: int) -> list[int]:
    """A tree shaped like a dynamic draft: each node under a random earlier node or the root."""
    rng = np.random.default_rng(seed)
    return [int(rng.integers(-1, i)) if i else -1 for i in range(num_nodes)]


def timed(executor, step: list[SeqInput]) -> float:
    start = time.perf_counter()
    executor.run(ForwardPlan(TARGET, step))
    return time.perf_counter() - start


def measure(llm, context: int, tokens: list[int], repeats: int) -> list[dict]:
    engine = llm.engine
    seq = "bench"
    engine.pages.ensure(seq, context + max(tokens) + 1)
    table = engine.pages.table(seq)
    engine.executor.run(ForwardPlan(TARGET, [SeqInput([0] * context, 0, table, logits="none")]))
    rows, base = [], None
    for t in tokens:
        chain = [-1] + list(range(t - 2)) if t > 1 else []
        parents = random_parents(t - 1, t)
        causal = [SeqInput([0] * t, context, table, logits="all")]
        masked = [SeqInput([0] * t, context, table, positions=tree_shape.verify_positions(parents, context), logits="all", tree_mask=tree_shape.verify_mask(parents))]
        assert len(chain) == len(parents)
        times: dict[str, list[float]] = {"causal": [], "tree": []}
        for _ in range(repeats):
            times["causal"].append(timed(engine.executor, causal))
            times["tree"].append(timed(engine.executor, masked))
        causal_ms, tree_ms = (min(times[k]) * 1e3 for k in ("causal", "tree"))
        base = base or causal_ms
        rows.append({"context": context, "tokens": t, "causal ms": round(causal_ms, 2), "tree ms": round(tree_ms, 2),
                     "tree/causal": round(tree_ms / causal_ms, 2), "cost vs 1 token": round(causal_ms / base, 2)})
    engine.pages.release(seq)
    return rows


def main(argv: list[str] | None = None) -> None:
    from speculant.llm import LLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    llm = LLM(args.model, device=args.device, dtype=args.dtype)
    print(machine())
    rows = [row for c in args.contexts for row in measure(llm, c, args.tokens, args.repeats)]
    print_table(rows, ["context", "tokens", "causal ms", "tree ms", "tree/causal", "cost vs 1 token"])


if __name__ == "__main__":
    main()
