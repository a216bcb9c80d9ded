"""Which op first computes a row differently in a multi-row forward than in a one-row step.

    python -m speculant.bench.row_diff --model smollm2-135m --weights auto --rows 5

Prefills a chat prompt, then runs its next `--rows` greedy tokens two ways: one token a forward
(plain decoding) and all in one forward (a verification). Every ATen op of the last one-row step
and of the verification is recorded; ops whose output has one row per token are compared row
for row (the verification's last row against the step's only row), in order, and the first that
differs is named with the largest difference. The native kernels are not ATen ops: a difference
born in one shows at the first op that reads its output. Prints "row-invariant" when none
differs, which is what every weight mode must print on the native kernels.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speculant.attention.batch import SeqInput
from speculant.config_options import add_engine_arguments, engine_config_from_args
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.sampling.params import SamplingParams

# Ops that move or re-view values without computing: a one-row and a multi-row forward may take
# different ones (a copy to make rows contiguous), so only computing ops are compared.
LAYOUT_OPS = {
    "view", "_unsafe_view", "reshape", "contiguous", "to", "_to_copy", "copy_", "clone", "transpose", "t",
    "permute", "expand", "slice", "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach",
    "lift_fresh", "split", "split_with_sizes", "chunk", "unbind", "narrow",
}


class OpRecorder(TorchDispatchMode):
    """(op name, output) of every computing ATen op whose output has `rows` rows (allocations
    left out: their contents are whatever the memory held)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.ops = rows, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if "empty" in name or name.removeprefix("aten.") in LAYOUT_OPS:
            return out
        if isinstance(out, torch.Tensor) and out.dim() >= 1 and out.shape[0] == self.rows and out.is_floating_point():
            self.ops.append((name, out.detach().clone()))
        return out


def first_difference(step_ops: list, verify_ops: list) -> dict | None:
    """The first op whose verification last row differs from the step's row (or where the two
    forwards stop running the same ops), else None."""
    for i, ((name_a, a), (name_b, b)) in enumerate(zip(step_ops, verify_ops)):
        if name_a != name_b:
            return {"index": i, "op": f"{name_a} (step) vs {name_b} (verification)", "max_abs_diff": None}
        if a.shape[1:] != b.shape[1:] or not torch.equal(a[-1], b[-1]):
            diff = (a[-1].double() - b[-1].double()).abs().max().item() if a.shape[1:] == b.shape[1:] else None
            return {"index": i, "op": name_a, "max_abs_diff": diff}
    return None


def run(llm, prompt: list[int], chain: list[int]) -> dict | None:
    executor, allocator, page_size = llm.engine.executor, llm.engine.pages.allocator, llm.engine.pages.page_size
    pages = [allocator.allocate(-(-(len(prompt) + len(chain)) // page_size)) for _ in range(2)]
    try:
        forward = lambda inputs: executor.run(ForwardPlan(TARGET, inputs))  # noqa: E731
        forward([SeqInput(prompt, 0, pages[0])])
        for i, token in enumerate(chain[:-1]):
            forward([SeqInput([token], len(prompt) + i, pages[0])])
        with OpRecorder(1) as step:
            forward([SeqInput(chain[-1:], len(prompt) + len(chain) - 1, pages[0])])
        forward([SeqInput(prompt, 0, pages[1])])
        with OpRecorder(len(chain)) as verify:
            forward([SeqInput(chain, len(prompt), pages[1], logits="all")])
    finally:
        for p in pages:
            allocator.free(p)
    return first_difference(step.ops, verify.ops)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_arguments(parser)
    parser.add_argument("--prompt", default="Explain in three sentences why the sky is blue.")
    parser.add_argument("--rows", type=int, default=5, help="tokens verified in one forward")
    args = parser.parse_args(argv)
    from speculant.llm import LLM

    llm = LLM(config=engine_config_from_args(args))
    prompt = llm.apply_chat_template([{"role": "user", "content": args.prompt}])
    chain = llm.generate([prompt], SamplingParams(max_tokens=args.rows, temperature=0, ignore_eos=True))[0].token_ids
    found = run(llm, prompt, chain)
    print("row-invariant" if found is None else f"first difference at op #{found['index']}: {found['op']} (max |diff| {found['max_abs_diff']})")
    return found


if __name__ == "__main__":
    main()
