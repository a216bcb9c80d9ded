"""One forward of M new rows (logits for every row, as a verification computes), wall time, with
two builds of the native kernels side by side in one process, interleaved repeat by repeat (so a
noisy neighbour hits both alike). `before` is another build's .so, e.g. an earlier commit's:

    git worktree add /tmp/before <rev> && (cd /tmp/before && python -m speculant.kernels.native)
    python results/native_kernels/ab_forward.py ~/.cache/speculant/native/<tag>/speculant_native_<tag>.so \
        --model qwen2.5-coder-1.5b --output results/native_kernels/ab_forward_q15.json

`after` is this checkout's build. Each model is built while its module is installed, so its
products and decoder stack hold that build's functions.
"""

import argparse
import importlib.util
import json
import pathlib
import time

from speculant import LLM
from speculant.attention.batch import SeqInput
from speculant.bench.common import git_commit, machine
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.kernels import native


def load_build(path: str):
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", help="the other build's .so")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    forwards = {}
    for name, build in (("before", load_build(args.before)), ("after", native.module())):
        native.module = lambda build=build: build
        engine = LLM(model=args.model, speculative="none").engine
        pages = engine.pages.allocator.allocate(-(-(args.context + max(args.rows)) // engine.pages.page_size))
        run = lambda inputs, ex=engine.executor: ex.run(ForwardPlan(TARGET, inputs))  # noqa: E731
        run([SeqInput(list(range(100, 100 + args.context)), 0, pages)])  # builds the stack with this build
        forwards[name] = (run, pages, engine)
    table = []
    for m in args.rows:
        times = {name: [] for name in forwards}
        for _ in range(args.repeats):
            for name, (run, pages, _) in forwards.items():
                start = time.perf_counter()
                run([SeqInput(list(range(500, 500 + m)), args.context, pages, logits="all")])
                times[name].append((time.perf_counter() - start) * 1e3)
        row = {"rows": m, **{f"{n} min": round(min(t), 2) for n, t in times.items()}, **{f"{n} median": round(sorted(t)[len(t) // 2], 2) for n, t in times.items()}}
        row["after/before (min)"] = round(row["after min"] / row["before min"], 3)
        table.append(row)
        print(row, flush=True)
    if args.output:
        out = {"args": vars(args), "commit": git_commit(), "machine": machine(), "forwards": table}
        pathlib.Path(args.output).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
