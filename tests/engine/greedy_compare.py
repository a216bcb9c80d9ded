"""Compare two greedy token sequences, allowing them to part only at a proven near-tie.

Two correct float implementations may pick different tokens where the top two logits are within
rounding of each other; after that the sequences legitimately differ. `assert_greedy_match`
accepts a difference only if, at the first differing position, the two tokens are the top two of
*both* sides' logits and their gap is below `gap` on both sides. It never loosens a tolerance.

Logits functions take the generated tokens before the position (the common prefix) and return
the next-token logits `[vocab]` after prompt + prefix; build them with `hf_logits_fn`,
`step_logits_fn` (from `generate(..., output_logits=True)`) or `engine_logits_fn`.

Import it from a test as `from greedy_compare import ...` (tests in tests/engine) or after
putting tests/engine on `sys.path`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

LogitsFn = Callable[[list[int]], torch.Tensor]  # generated prefix -> [vocab] next-token logits

DEFAULT_GAP = 1e-3  # float32 logits of tiny models differ by ~1e-5 between implementations


def first_difference(ours: Sequence[int], ref: Sequence[int]) -> int | None:
    """Index of the first differing token, len of the shorter if one is a prefix, None if equal."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(ref) else min(len(ours), len(ref))


def assert_greedy_match(
    ours: Sequence[int],
    ref: Sequence[int],
    ref_logits_fn: LogitsFn,
    ours_logits_fn: LogitsFn,
    gap: float = DEFAULT_GAP,
) -> int | None:
    """Pass if the sequences are equal, or part at a near-tie; return where they part (or None)."""
    ours, ref = list(ours), list(ref)
    i = first_difference(ours, ref)
    if i is None:
        return None
    if i == min(len(ours), len(ref)):
        raise AssertionError(
            f"one greedy sequence stops where the other goes on at position {i}: "
            f"ours has {len(ours)} tokens, reference {len(ref)}\n ours={ours}\n  ref={ref}"
        )
    a, b = ours[i], ref[i]
    prefix = ours[:i]
    for side, logits in (("reference", ref_logits_fn(prefix)), ("ours", ours_logits_fn(prefix))):
        _assert_near_tie(side, logits.float().reshape(-1), a, b, i, gap)
    return i


def _assert_near_tie(side: str, logits: torch.Tensor, a: int, b: int, i: int, gap: float) -> None:
    values, top2 = logits.topk(2)
    where = f"at generated position {i} (ours {a}, reference {b})"
    if set(top2.tolist()) != {a, b}:
        raise AssertionError(
            f"greedy outputs part {where}, but {side}'s top-2 tokens are {top2.tolist()} "
            f"(logits {values.tolist()}): not a tie"
        )
    diff = (logits[a] - logits[b]).abs().item()
    if diff >= gap:
        raise AssertionError(
            f"greedy outputs part {where}; {side}'s logit gap {diff:.3g} >= {gap}: not a tie"
        )


def hf_logits_fn(hf_model, prompt: Sequence[int]) -> LogitsFn:
    """transformers' next-token logits from one forward over prompt + prefix."""

    def fn(prefix: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf_model(torch.tensor([list(prompt) + prefix])).logits[0, -1].float()

    return fn


def step_logits_fn(step_logits: Sequence[torch.Tensor]) -> LogitsFn:
    """From `generate(..., output_logits=True, return_dict_in_generate=True).logits` (batch 1):
    the logits transformers chose generated token `len(prefix)` from."""
    return lambda prefix: step_logits[len(prefix)][0].float()


def engine_logits_fn(engine, prompt: Sequence[int]) -> LogitsFn:
    """Our target's next-token logits from one fresh forward over prompt + prefix, on pages taken
    from the engine's free list (and given back); safe while other requests hold pages."""
    from speculant.attention.batch import SeqInput
    from speculant.executor.plan import TARGET, ForwardPlan

    def fn(prefix: list[int]) -> torch.Tensor:
        tokens = list(prompt) + prefix
        allocator, page_size = engine.pages.allocator, engine.pages.page_size
        pages = allocator.allocate(-(-len(tokens) // page_size))
        try:
            logits = engine.executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, pages, logits="last")])).logits
        finally:
            allocator.free(pages)
        return logits[0].float()

    return fn


__all__ = [
    "DEFAULT_GAP",
    "assert_greedy_match",
    "engine_logits_fn",
    "first_difference",
    "hf_logits_fn",
    "step_logits_fn",
]
