"""A model forward reads token ids or input embeddings; the final norm is callable on its own."""

from __future__ import annotations

import pytest
import torch
from testkit import TinyCheckpoint, tiny_hf_model

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan

PAGES = list(range(16))
SEQS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], list(range(20, 33))]


def _executor(kind: str) -> Executor:
    executor = Executor(build_runner(TinyCheckpoint(tiny_hf_model(kind)), ModelConfig(model="tiny")))
    executor.allocate_kv(3 * len(PAGES), 4)
    return executor


def _inputs(start_page: int = 0) -> list[SeqInput]:
    return [SeqInput(s, 0, [p + 16 * b + start_page for p in range(4)], logits="all") for b, s in enumerate(SEQS)]


def test_embeddings_path_equals_token_id_path(tiny_kind):
    executor = _executor(tiny_kind)
    model = executor.runner().model
    by_ids = executor.run(ForwardPlan(TARGET, _inputs()))
    embeds = model.embed(torch.tensor([t for s in SEQS for t in s]))  # [T, hidden]
    by_embeds = executor.run(ForwardPlan(TARGET, _inputs(start_page=4), input_embeds=embeds))
    torch.testing.assert_close(by_embeds.hidden, by_ids.hidden, atol=0, rtol=0)
    torch.testing.assert_close(by_embeds.logits, by_ids.logits, atol=0, rtol=0)


def test_final_norm_then_lm_head_equals_compute_logits(tiny_kind):
    executor = _executor(tiny_kind)
    model = executor.runner().model
    hidden = executor.run(ForwardPlan(TARGET, _inputs())).hidden  # [T, hidden]
    normed = model.final_norm(hidden)
    assert normed.shape == hidden.shape
    torch.testing.assert_close(torch.linalg.vector_norm(normed / model.norm, dim=-1) ** 2 / hidden.shape[1],
                               torch.ones(hidden.shape[0]), atol=1e-3, rtol=1e-3)
    logits, cap = model.lm_head(normed).float(), model.arch.final_logit_softcap
    torch.testing.assert_close(logits if cap is None else cap * torch.tanh(logits / cap), model.compute_logits(hidden))


def test_bad_extra_inputs_are_clear_errors():
    executor = _executor("llama")
    num_tokens = sum(len(s) for s in SEQS)
    with pytest.raises(ValueError, match="hidden_states"):
        executor.run(ForwardPlan(TARGET, _inputs(), hidden_states=torch.zeros(num_tokens, 64)))
    with pytest.raises(ValueError, match="input_embeds has 3 rows"):
        executor.run(ForwardPlan(TARGET, _inputs(), input_embeds=torch.zeros(3, 64)))
