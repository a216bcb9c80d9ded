"""Each forward row's logit adjustments (`speculant.sampling.logit_adjust`), built from request
state and the drafts on the row's path, and the grammar matchers behind them.

A step's rows are laid out as draft trees: sequence b owns len(parents[b]) + 1 consecutive rows,
row 0 its last verified token and row i + 1 its draft node i (a chain is the tree whose node i
hangs under node i - 1; a plain step's sequence is a lone root). The row of node i is adjusted as
plain decoding would adjust the position after node i: its output holds the request's tokens
plus the drafts from the root to node i, and its grammar state is the matcher after them.

Matchers advance only at commit, over the tokens the request kept, so they always stand at the
end of the request's output. Grammar masks need the draft tokens on the host: a step that
verifies drafts for a constrained request reads them (one read more than the step's rule of one;
steps without a constrained request are unchanged). Counts, bans and biases stay on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from speculant.core import Request
from speculant.engine.grammar import GrammarCompiler, consume, tree_masks
from speculant.sampling.logit_adjust import LogitAdjustments, adjust_logits
from speculant.sampling.params import SamplingParams
from speculant.sampling.tree_shape import ancestor_table, depths
from speculant.utils.sync import to_list


class LogitControls:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: frozenset[int], device: torch.device) -> None:
        self.compiler = GrammarCompiler(tokenizer, vocab_size, stop_token_ids)
        self.vocab_size = vocab_size
        self.device = device
        self._matchers: dict[str, object] = {}

    # ---- requests ---------------------------------------------------------------------------

    def check(self, params: SamplingParams) -> None:
        """Raise ValueError naming the field when the request's rules cannot be applied."""
        bad = [t for t, _ in params.logit_bias if t >= self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        if params.structured_output is None:
            return
        if params.ignore_eos:
            raise ValueError("structured_output cannot be combined with ignore_eos: a grammar ends on its EOS")
        self.compiler.check(params.structured_output)

    def admit(self, request: Request) -> None:
        """Start the request's matcher (at the end of its output, for a re-admitted request)."""
        structured = request.params.structured_output
        if structured is None:
            return
        matcher = self.compiler.matcher(structured)
        if not consume(matcher, request.output_token_ids):
            raise ValueError(f"structured_output: the output so far does not match: {matcher.get_error()}")
        self._matchers[request.request_id] = matcher

    def advance(self, request: Request, tokens: list[int]) -> str | None:
        """Move the matcher over the tokens the request kept; an error message if it refuses them."""
        matcher = self._matchers.get(request.request_id)
        if matcher is None or consume(matcher, tokens):
            return None
        return f"structured_output: the grammar refused an emitted token: {matcher.get_error()[:300]}"

    def release(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    # ---- rows -------------------------------------------------------------------------------

    def adjust(
        self,
        requests: Sequence[Request],  # [B]
        parents: Sequence[Sequence[int]],  # [B][n_b] each sequence's draft tree ([] on a plain step)
        drafts: torch.Tensor | None,  # [B, n_max] int64 the trees' tokens (device), -1 padded; None without drafts
        logits: torch.Tensor,  # [sum(n_b + 1), V]
    ) -> torch.Tensor:
        """The logits every decision of the step is taken from: `logits` itself when no request
        adjusts them."""
        if not any(r.params.adjusts_logits for r in requests):
            return logits
        return adjust_logits(logits, self.rows(requests, parents, drafts))

    def rows(self, requests: Sequence[Request], parents: Sequence[Sequence[int]], drafts: torch.Tensor | None) -> LogitAdjustments:
        params = [r.params for r in requests]
        seq_of_row = [b for b, p in enumerate(parents) for _ in range(len(p) + 1)]
        depth_of_row = [int(d) for p in parents for d in [0, *depths(p)]]
        row_seq = torch.tensor(seq_of_row, device=self.device)
        path = _path_tokens(parents, drafts, self.device)  # [R, D]
        adj = LogitAdjustments()
        if any(p.structured_output for p in params):
            adj.allowed = self._masks(requests, parents, drafts)
        if any(p.min_tokens for p in params):
            adj.banned = self._bans(requests, seq_of_row, depth_of_row)
        if any(p.logit_bias for p in params):
            adj.bias = self._bias(params).index_select(0, row_seq)
        penalised = any(p.frequency_penalty or p.presence_penalty for p in params)
        repeated = any(p.repetition_penalty != 1.0 for p in params)
        drafted = self._one_hot_sum(path) if penalised or repeated else None  # [R, V] the drafts on each row's path
        if penalised:
            base = torch.stack([self._counts(r.output_token_ids) for r in requests])  # [B, V]
            adj.output_counts = base.index_select(0, row_seq) + drafted
            adj.frequency = self._column([p.frequency_penalty for p in params], row_seq)
            adj.presence = self._column([p.presence_penalty for p in params], row_seq)
        if repeated:
            base = torch.stack([self._counts(r.prompt_token_ids + r.output_token_ids) > 0 for r in requests])
            adj.seen = base.index_select(0, row_seq) | (drafted > 0)
            adj.repetition = self._column([p.repetition_penalty for p in params], row_seq)
        return adj

    def _masks(self, requests, parents, drafts) -> torch.Tensor:  # [R, W] int32
        """Grammar masks of every row; unconstrained rows allow everything."""
        constrained = [b for b, r in enumerate(requests) if r.request_id in self._matchers]
        tokens = to_list(drafts) if drafts is not None and any(parents[b] for b in constrained) else None
        starts = np.cumsum([0] + [len(p) + 1 for p in parents])
        out = np.full((int(starts[-1]), self.compiler.num_words), -1, dtype=np.int32)  # numpy: host data, no tensor reads
        for b in constrained:
            rows = out[starts[b] : starts[b + 1]]
            tree_masks(self._matchers[requests[b].request_id], tokens[b] if tokens else [], parents[b], rows, requests[b].stop_token_ids)
        return torch.from_numpy(out).to(self.device)

    def _bans(self, requests, seq_of_row, depth_of_row) -> torch.Tensor:  # [R, V] bool
        """Stop tokens at rows whose position comes before the request's min_tokens."""
        banned = torch.zeros(len(seq_of_row), self.vocab_size, dtype=torch.bool)
        for row, (b, depth) in enumerate(zip(seq_of_row, depth_of_row)):
            r = requests[b]
            if len(r.output_token_ids) + depth < r.params.min_tokens:
                banned[row, [t for t in r.stop_token_ids if t < self.vocab_size]] = True
        return banned.to(self.device)

    def _bias(self, params: Sequence[SamplingParams]) -> torch.Tensor:  # [B, V] float32
        bias = torch.zeros(len(params), self.vocab_size)
        for b, p in enumerate(params):
            for token, value in p.logit_bias:
                if token < self.vocab_size:
                    bias[b, token] += value
        return bias.to(self.device)

    def _counts(self, token_ids: list[int]) -> torch.Tensor:  # [V] float32
        ids = torch.tensor(token_ids, dtype=torch.int64, device=self.device)
        counts = torch.zeros(self.vocab_size, device=self.device)  # index_add, not bincount: no output size to read
        return counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))

    def _one_hot_sum(self, path: torch.Tensor) -> torch.Tensor:  # [R, D] -> [R, V] float32
        counts = torch.zeros(path.shape[0], self.vocab_size, device=self.device)
        return counts.scatter_add_(1, path.clamp(min=0), (path >= 0).float())

    def _column(self, values: list[float], row_seq: torch.Tensor) -> torch.Tensor:  # [R] float32
        return torch.tensor(values, dtype=torch.float32, device=self.device).index_select(0, row_seq)


def _path_tokens(parents: Sequence[Sequence[int]], drafts: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """[R, D] int64 the draft tokens on each row's path from the root (-1 padded), gathered on
    the device from the host-known tree shapes."""
    width = max((int(depths(p).max()) for p in parents if len(p)), default=0)
    num_rows = sum(len(p) + 1 for p in parents)
    if drafts is None or width == 0:
        return torch.full((num_rows, 0), -1, dtype=torch.int64, device=device)
    stride = drafts.shape[1]
    index = np.full((num_rows, width), -1, dtype=np.int64)
    row = 0
    for b, p in enumerate(parents):
        table = ancestor_table(p, width)  # [n_b, D] node indices
        index[row + 1 : row + 1 + len(p)] = np.where(table >= 0, b * stride + table, -1)
        row += len(p) + 1
    flat = torch.from_numpy(index).to(device)
    tokens = drafts.to(device).reshape(-1).index_select(0, flat.clamp(min=0).reshape(-1)).view(num_rows, width)
    return torch.where(flat >= 0, tokens, -1)


__all__ = ["LogitControls"]
