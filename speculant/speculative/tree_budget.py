"""Tree size from measured cost: the node budget that maximises expected tokens per second.

Verifying many tokens is not free on a CPU (a 9-token verify costs a few 1-token steps), nearly
so on a GPU; so the budget comes from two measurements instead of a constant:

- the verify cost curve: seconds of one target forward verifying t tokens over a fixed context,
  measured at start-up (`measure_points`), interpolated linearly between the measured t;
- acceptance by budget: trees list their nodes in rank order (parents first), so the tree of
  budget b is the first b nodes of a bigger one, and the path it would have accepted is the
  accepted path's nodes of index < b. Every verified tree thus counts for every budget up to
  its size. Until `WARMUP` trees are seen the largest budget is verified, so every budget is
  measured; then one step in `EXPLORE` verifies twice the chosen budget (the largest at most), so
  the budgets just above the choice stay measured at little cost and a better larger one is found
  by climbing.

expected tokens/s (b) = (1 + mean accepted at b) / step seconds (b)

Step seconds are measured per budget (a moving average of whole decode steps, proposing and the
head included) once a few steps ran at it, and estimated before: verify seconds (b + 1) + draft
seconds (b). The estimate alone misses the host's work around a tree: on a Zen 1 CPU it priced a
one-node tree 10% above a plain step where it was 16% below.

Budget 0 is a plain step (one token for one row's verify): where no tree pays, the chooser
takes it, and exploration then verifies a one-node tree every RESTING_EXPLORE steps (a probe at
every EXPLORE-th step cost a Zen 1 CPU ~8% of plain decoding's speed).

A tree of b nodes is at most b deep, so it grows at most min(depth, b) levels: the draft seconds
of budget b are the measured seconds per head level times the min(depth, b) - 1 levels past the
first (whose children come from the carried logits), plus the head's measured run over a tree
step's verified rows (b > 0 only). Pure arithmetic: no engine, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from speculant.speculative.cost_model import MovingAverage

WARMUP = 16  # trees verified at the largest budget before choosing
EXPLORE = 8  # then every EXPLORE-th step verifies twice the chosen budget
RESTING_EXPLORE = 32  # while plain steps pay best, a one-node tree every RESTING_EXPLORE-th step
MEASURED = 3  # steps at a budget before their measured time replaces the estimate


def measure_points(max_budget: int) -> list[int]:
    """Verified-token counts (a tree of b nodes verifies b + 1) to time at start-up."""
    points, t = [], 1
    while t < max_budget + 1:
        points.append(t)
        t *= 2
    return points + [max_budget + 1]


def grown_levels(depth: int, budget: int) -> int:
    """Head forwards that grow a tree of `budget` nodes at most `depth` deep."""
    return max(0, min(depth, budget) - 1)


class TreeBudget:
    def __init__(self, max_budget: int, verify_seconds: dict[int, float], depth: int | None = None) -> None:
        self.max_budget, self.depth = max_budget, max_budget if depth is None else depth
        self.verify_t = np.array(sorted(verify_seconds), dtype=float)  # [P] verified tokens
        self.verify_s = np.array([verify_seconds[t] for t in sorted(verify_seconds)])  # [P] seconds
        self.accepted = np.zeros(max_budget + 1)  # [b] accepted drafts summed over trees of size >= b
        self.trees = np.zeros(max_budget + 1)  # [b] trees of size >= b seen
        self.level_s = MovingAverage(0.0)  # seconds per head level grown
        self.feed_s = MovingAverage(0.0)  # seconds of the head's run over a tree step's verified rows
        self.step_s: dict[int, MovingAverage] = {}  # budget -> measured seconds of a whole step at it
        self.steps = 0
        self.chosen = max_budget

    def record_tree(self, size: int, path: Sequence[int]) -> None:
        """One verified tree of `size` nodes whose accepted path has these node indices."""
        budgets = np.arange(size + 1)
        within = (np.asarray(path, dtype=np.int64)[None, :] < budgets[:, None]).sum(1) if len(path) else np.zeros(size + 1)
        self.accepted[: size + 1] += within
        self.trees[: size + 1] += 1

    def record_draft(self, seconds: float, levels: int) -> None:
        """A step spent `seconds` growing trees `levels` head forwards deep."""
        if levels > 0:
            self.level_s.update(seconds / levels)

    def record_feed(self, seconds: float) -> None:
        """A tree step's head run over the verified rows took `seconds` (a plain step's head waits)."""
        self.feed_s.update(seconds)

    def draft_seconds(self, budget: int) -> float:
        """The head's seconds around a tree of `budget` nodes: its levels, and its run over the
        verified rows after (none for budget 0: the head waits, `MtpProposer.follows_lazily`)."""
        return self.level_s.value * grown_levels(self.depth, budget) + (self.feed_s.value if budget else 0.0)

    def record_step(self, budget: int, seconds: float) -> None:
        """A decode step at `budget` (0: plain) took `seconds`, everything counted."""
        self.step_s.setdefault(budget, MovingAverage(0.0)).update(seconds)

    def step_seconds(self, budget: int) -> float:
        """Measured seconds of a step at the budget once MEASURED steps ran at it, else the parts'
        estimate (verify + head), which leaves out the host's work around a tree."""
        measured = self.step_s.get(budget)
        if measured is not None and measured.count >= MEASURED:
            return measured.value
        return self.verify_seconds(budget + 1) + self.draft_seconds(budget)

    def verify_seconds(self, tokens: int) -> float:
        return float(np.interp(tokens, self.verify_t, self.verify_s))

    def expected_rate(self, budget: int) -> float:
        """Expected tokens per second of a step verifying a tree of `budget` nodes."""
        tau = 1.0 + self.accepted[budget] / max(self.trees[budget], 1.0)
        return tau / self.step_seconds(budget)

    def choose(self) -> int:
        """The budget of the next step."""
        self.steps += 1
        if self.trees[self.max_budget] < WARMUP:
            return self.max_budget
        if self.steps % (EXPLORE if self.chosen else RESTING_EXPLORE) == 0:  # a probe from rest costs a tree step that does not pay
            return min(self.max_budget, max(1, 2 * self.chosen))
        measured = [b for b in range(self.max_budget + 1) if self.trees[b] > 0]  # 0: no tree, a plain step
        self.chosen = max(measured, key=self.expected_rate)
        return self.chosen
