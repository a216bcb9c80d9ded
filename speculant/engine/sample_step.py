"""The plain stage of a step (prefill chunks, mixed batches, decoding without speculation): one
target forward whose inputs are gathered from the token pool, a sample for every sequence that
reaches the end of its tokens, then the step's one read. Request state is left to the engine
(`Engine._apply`)."""

from __future__ import annotations

import itertools

import torch

from speculant.attention.batch import SeqInput
from speculant.core import Batch, Request, StepOutput, StepResult
from speculant.engine.chain_verify import row_offsets
from speculant.engine.readout import read_step
from speculant.engine.sampling_rows import SamplingRows
from speculant.engine.stage_parts import StageParts
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.sampling.sampler import sample_logits


def forward_and_sample(parts: StageParts, batch: Batch) -> tuple[StepOutput, StepResult]:
    seqs = batch.seqs
    inputs = [
        SeqInput([0] * s.num_new_tokens, s.request.num_computed_tokens, parts.pages.table(s.request.request_id), logits="last" if s.samples else "none")
        for s in seqs
    ]
    spans = [range(s.request.num_computed_tokens, s.request.num_computed_tokens + s.num_new_tokens) for s in seqs]
    out = parts.executor.run(ForwardPlan(TARGET, inputs, input_ids=parts.pool.gather(batch.requests, spans)))
    samples = [s.samples for s in seqs]
    sampling = [s.request for s in seqs if s.samples]
    decided = parts.controls.adjust(sampling, [[] for _ in sampling], None, out.logits)  # [#sampling, V]
    bonus = _sample_rows(decided, samples, sampling, parts.rows, parts.generator)  # [B]
    offsets = row_offsets([s.num_new_tokens for s in seqs])
    starts = [s.request.num_computed_tokens for s in seqs]
    result = StepResult(batch.requests, offsets, starts, out.hidden, torch.zeros_like(bonus), bonus, None, speculative=False)
    parts.pool.write(batch.requests, bonus[:, None], [r.num_tokens for r in batch.requests])
    parts.executor.drive(parts.proposer.launch(result))  # before the host reads the step
    if not sampling:
        return StepOutput([[] for _ in seqs]), result
    rank = list(itertools.accumulate(samples, initial=-1))[1:]  # each sequence's logits row
    rows = torch.tensor([[max(0, i)] for i in rank], device=bonus.device)  # [B, 1]
    with parts.timeline.span("read"):
        step_out, _, _ = read_step(bonus[:, None], [int(x) for x in samples], out.logits, rows, batch.requests)
    return step_out, result


def _sample_rows(
    logits: torch.Tensor, samples: list[bool], requests: list[Request], sampling_rows: SamplingRows, generator: torch.Generator,
) -> torch.Tensor:
    """[B] int64: the sampled token of each sequence that samples (`logits` row by row), -1 elsewhere."""
    tokens = torch.full((len(samples),), -1, dtype=torch.int64, device=logits.device)
    if requests:
        rows = torch.tensor([b for b, sampled in enumerate(samples) if sampled], device=logits.device)
        st = sampling_rows.tensors(requests)
        generators = [r.noise.generator(r.num_tokens, logits.device) if r.noise else None for r in requests]  # the sampled token's position
        tokens.index_copy_(0, rows, sample_logits(logits, st, generators, generator))  # integer rows: no device sync
    return tokens
