"""What a proposer hands the executor: the models it needs, and the forwards a step runs on them.

A proposer never holds a model runner. It declares its models once (`ModelSpec`: the executor
loads them, owns their runners and their K/V in the shared pages), and each step it yields
`ForwardPlan`s; the executor runs each one and sends back a `ForwardResult`. A chain of dependent
forwards (k draft steps) is a generator:

    def propose(self, batch):
        result = yield ForwardPlan("draft", inputs)   # the executor runs it, sends the result
        ...
        return DraftProposal(...)
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig

TARGET = "target"  # the engine's own model, always present

T = TypeVar("T")


@dataclass(frozen=True)
class ModelSpec:
    """A model a proposer needs: the executor loads it (or takes `checkpoint`) and runs it."""

    name: str  # how plans refer to it; never TARGET
    config: ModelConfig  # `config.model` names the checkpoint; dtype, device, attention backend
    checkpoint: Any = None  # an already loaded checkpoint (tests); None loads config.model
    shares_vocab: bool = True  # must the model's vocabulary equal the target's
    head_of: str | None = None  # a draft head over this model's embedding and lm_head (a head folder)
    own_head: bool = False  # the head is the head_of model's own MTP layer (DeepSeek-V3), not a folder


@dataclass(frozen=True)
class ForwardPlan:
    """One forward of one model over a flat ragged batch in the shared pages."""

    model: str  # TARGET or a ModelSpec name
    inputs: list[SeqInput]  # per sequence: new tokens, KV start, page table, which rows get logits
    input_ids: torch.Tensor | None = None  # [T] device token ids used instead of the inputs' (whose lengths still lay out the batch)
    input_embeds: torch.Tensor | None = None  # [T, hidden] used instead of the token ids' embeddings
    hidden_states: torch.Tensor | None = None  # [T, hidden_in] extra input of draft heads
    logits_rows: torch.Tensor | None = None  # [N] device rows of the flat batch that get logits, instead of the inputs' flags (no host read)


@dataclass(frozen=True)
class ForwardResult:
    logits: torch.Tensor  # [N, vocab] float32, the rows the plan asked for (logits_rows, or its SeqInput.logits flags), in order
    hidden: torch.Tensor  # [T, hidden] last-layer states of every token, before the final norm
    # (a model with exposed feature layers, `Executor.expose_features`: [T, layers * hidden])


# What proposers write: yields plans, receives their results, returns a value (or None).
Forwards = Generator[ForwardPlan, ForwardResult, T]
