"""Each verified row's adjustments are those of plain decoding at its position: token counts,
seen tokens and min_tokens bans include the drafts on the row's path (chains and trees), and
nothing else."""

from __future__ import annotations

import torch

from speculant import SamplingParams
from speculant.core import Request
from speculant.engine.logit_rows import LogitControls

V, EOS = 10, 2


def _request(output: list[int], **rules) -> Request:
    request = Request("r", [1, 3], SamplingParams(max_tokens=8, **rules), stop_token_ids=frozenset({EOS}))
    request.output_token_ids = list(output)
    return request


def _counts(rows: list[dict[int, int]]) -> torch.Tensor:
    out = torch.zeros(len(rows), V)
    for i, row in enumerate(rows):
        for token, n in row.items():
            out[i, token] = n
    return out


def test_chain_rows_count_the_drafts_before_them():
    controls = LogitControls(None, V, frozenset({EOS}), torch.device("cpu"))
    request = _request([5], frequency_penalty=1.0, repetition_penalty=1.2, min_tokens=3)
    adj = controls.rows([request], [[-1, 0, 1]], torch.tensor([[5, 5, 7]]))
    assert torch.equal(adj.output_counts, _counts([{5: 1}, {5: 2}, {5: 3}, {5: 3, 7: 1}]))
    assert adj.seen[:, [1, 3, 5]].all() and adj.seen[:, 7].tolist() == [False, False, False, True]
    assert adj.banned[:, EOS].tolist() == [True, True, False, False]  # outputs of 1, 2, 3, 4 tokens before the row


def test_tree_rows_count_only_their_own_path():
    controls = LogitControls(None, V, frozenset({EOS}), torch.device("cpu"))
    first, second = _request([6], presence_penalty=0.5), _request([], presence_penalty=0.5)
    drafts = torch.tensor([[4, 6, 8], [9, -1, -1]])
    adj = controls.rows([first, second], [[-1, -1, 0], [-1]], drafts)
    expected = [{6: 1}, {6: 1, 4: 1}, {6: 2}, {6: 1, 4: 1, 8: 1}, {}, {9: 1}]
    assert torch.equal(adj.output_counts, _counts(expected))
    assert adj.presence.tolist() == [0.5] * 6


def test_unadjusted_requests_leave_the_logits_themselves():
    controls = LogitControls(None, V, frozenset({EOS}), torch.device("cpu"))
    logits = torch.randn(4, V)
    assert controls.adjust([_request([5])], [[-1, 0, 1]], torch.tensor([[5, 5, 7]]), logits) is logits
