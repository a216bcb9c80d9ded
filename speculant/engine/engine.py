"""The engine: one scheduler, one page allocator, an executor (which runs the target and the
proposer's models) and a proposer.

`step()` = schedule → (propose → verify → accept | forward → sample) → commit → proposer update.
Every model forward is a plan the executor runs. Speculation runs only on decode batches; prefill
and mixed batches sample normally.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from speculant.config import EngineConfig
from speculant.core import (
    Batch,
    Request,
    RequestOutput,
    RequestStatus,
    StepOutput,
    StepResult,
)
from speculant.engine.chain_verify import verify_chain
from speculant.engine.executor_factory import create_executor
from speculant.engine.logit_rows import LogitControls
from speculant.engine.memory import plan_engine, resolve_budget
from speculant.engine.output import OutputProcessor
from speculant.engine.sample_step import forward_and_sample
from speculant.engine.sampling_rows import SamplingRows
from speculant.engine.stage_parts import StageParts
from speculant.engine.stats import EngineStats
from speculant.engine.timeline import Timeline
from speculant.engine.token_pool import TokenPool
from speculant.engine.tree_verify import verify_tree
from speculant.engine.worker import StepWorker
from speculant.kv_cache.allocator import PageAllocator, PageTables
from speculant.sampling.params import SamplingParams
from speculant.sampling.rng import PositionNoise
from speculant.scheduler.scheduler import Scheduler
from speculant.speculative.base import ProposerContext
from speculant.speculative.registry import create_proposer
from speculant.utils.sync import guarded_step, host_reads, strict_enabled


class Engine:
    def __init__(self, config: EngineConfig, checkpoint=None, draft_checkpoint=None) -> None:
        self.config = config
        self.device = torch.device(config.model.device)
        budget = resolve_budget(config.cache.memory_budget, self.device)  # free memory before any weight
        self.executor, self.tokenizer = create_executor(config, checkpoint)
        self.arch = self.executor.arch()
        self.generator = torch.Generator(device=self.device).manual_seed(config.model.seed)  # unseeded rows' noise, drawn on the device
        self.proposer = create_proposer(
            ProposerContext(
                config.speculative, config.model, self.arch, self.device, self.generator, draft_checkpoint,
                config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens,
                target_features=config.parallel.tensor_parallel_size == 1,
            )
        )
        try:
            for spec in self.proposer.model_specs():
                self.executor.add_model(spec)
        except Exception:  # a refused model: stop tensor-parallel workers now, not at garbage collection
            self.executor.close()
            raise
        self.num_pages = self._allocate_cache(budget)
        self.pages = PageTables(PageAllocator(self.num_pages), config.cache.page_size)
        self.proposer.bind(self.pages)
        self.executor.drive(self.proposer.calibrate())
        self.scheduler = Scheduler(config.scheduler, self.pages, self.proposer.lookahead_slots, self._preempted)
        # A sequence whose KV would outgrow the whole cache finishes ("length") like one reaching
        # the context: left running, it would preempt itself and wait for pages forever.
        max_tokens = min(self.arch.max_position, self.num_pages * config.cache.page_size + 1)
        self.outputs = OutputProcessor(self.tokenizer, max_tokens)
        self.pool = TokenPool(config.scheduler.max_num_seqs, max_tokens, self.device)  # inputs gathered on the device
        self.requests: dict[str, Request] = {}
        self.rows = SamplingRows(self.device)
        self.stats = EngineStats()
        self.timeline = Timeline()
        self.executor.timeline = self.timeline
        self.worker = StepWorker(self.timeline) if config.scheduler.overlap else None
        self._prepared: Batch | None = None  # the next step's batch, scheduled during this one
        self.stop_token_ids = _stop_token_ids(self.tokenizer, self.arch)
        self.controls = LogitControls(self.tokenizer, self.arch.vocab_size, self.stop_token_ids, self.device)
        self.parts = StageParts(self.executor, self.proposer, self.pages, self.pool, self.rows, self.generator, self.timeline, self.controls)
        # A request without parameters samples with the checkpoint's defaults (generation_config.json).
        self.default_params = SamplingParams(**self.arch.generation.sampling_overrides())
        self._ids = itertools.count()

    def _allocate_cache(self, budget: int | None) -> int:
        """Pages from the memory plan (`speculant.engine.memory`), every model's K/V per page."""
        self.memory = plan_engine(self.config, self.executor, self.proposer, budget)
        self.executor.allocate_kv(self.memory.num_pages, self.config.cache.page_size)
        return self.memory.num_pages

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None, user: str | None = None
    ) -> Request:
        """Queue a request. `user` scopes state shared across requests (the n-gram store); None
        shares nothing."""
        params = params or self.default_params
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        request = self.check_request(prompt, params, request_id)
        request.user = user
        if params.seed is not None:
            request.noise = PositionNoise(params.seed)
        self.controls.admit(request)
        self.scheduler.add(request)
        self.requests[request_id] = request
        return request

    def check_request(self, prompt: str | list[int], params: SamplingParams, request_id: str = "") -> Request:
        """The request `add_request` would queue; raises ValueError naming the bad field."""
        token_ids = self._tokenize(prompt)
        request = Request(request_id, token_ids, params, stop_token_ids=self.stop_token_ids | set(params.stop_token_ids))
        self._check_fits(request)
        bad = [t for t in request.params.stop_token_ids if t >= self.arch.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids must be in [0, {self.arch.vocab_size}), got {bad[:5]}")
        self.controls.check(params)
        return request

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if self.tokenizer is None:
                raise ValueError("prompt: this model has no tokenizer; pass token ids")
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            token_ids = [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("prompt must not be empty")
        bad = [t for t in token_ids if not 0 <= t < self.arch.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {self.arch.vocab_size}), got {bad[:5]}")
        return token_ids

    def _check_fits(self, request: Request) -> None:
        n, limit = request.num_prompt_tokens, self.arch.max_position
        if n >= limit:
            raise ValueError(f"prompt is {n} tokens, longer than the model's context of {limit} (leave room for one output token)")
        slots = n + 1 + self.proposer.lookahead_slots(request)
        if self.pages.pages_for(slots) > self.num_pages:
            raise ValueError(
                f"prompt needs {self.pages.pages_for(slots)} KV pages, the cache has {self.num_pages} "
                f"({self.memory.kv_cache} bytes; memory_budget or kv_cache_bytes sizes it)"
            )

    def abort_request(self, request_id: str, error: str | None = None) -> RequestOutput | None:
        """Finish a request now: "abort", or "error" with the message when `error` is given."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        request.status = RequestStatus.FINISHED_ABORTED if error is None else RequestStatus.FINISHED_ERROR
        request.error = error
        self._retire(request)
        self.stats.record_finish(request)
        return self.outputs.make_output(request, [])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def close(self) -> None:
        """Stop what the engine started outside this process (tensor-parallel workers)."""
        self.executor.close()

    # ---- one step -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        self.timeline.begin_step()
        with self.timeline.span("schedule"):
            batch, failed = self._without_failed_rows(self._next_batch())
        if not batch.seqs:
            self.timeline.end_step()
            return failed
        self.pool.admit(batch.requests)
        start, reads, decode = time.perf_counter(), host_reads(), batch.is_decode
        with self.stats.timed_step(batch), guarded_step():
            with self.timeline.span("plan"):
                speculative = self.proposer.speculates(batch)  # fixes each request's k (all 0: a plain step)
                self.stats.record_ks(self.proposer.chosen_ks())
            step_out, result = self._run(batch, speculative)
            with self.timeline.span("commit"):
                self._apply(batch, step_out, result)
                outputs = failed + self._commit(batch, step_out, result)
            if strict_enabled() and decode:
                self.stats.record_decode_reads(host_reads() - reads)
        self.proposer.observe(result, time.perf_counter() - start)
        self.timeline.end_step()
        return outputs

    def _next_batch(self) -> Batch:
        """The batch prepared during the last step (minus requests that finished), else a fresh one."""
        prepared, self._prepared = self._prepared, None
        seqs = [s for s in prepared.seqs if not s.request.finished] if prepared is not None else []
        return Batch(seqs) if seqs else self.scheduler.schedule()

    def _run(self, batch: Batch, speculative: bool) -> tuple[StepOutput, StepResult]:
        """The device stage; with overlap it runs in the worker while the host prepares the next
        batch from what it knows: each sampling request may append up to k + 1 tokens."""
        if self.worker is None:
            return self._device_stage(batch, speculative)
        grow = {s.request: (self.proposer.step_k(s.request) + 1 if speculative else 1) if s.samples else 0 for s in batch.seqs}
        in_flight = {s.request: (s.num_new_tokens, grow[s.request]) for s in batch.seqs}
        pending = self.worker.submit(self._device_stage, batch, speculative)
        with self.timeline.span("prepare"):
            self._prepared = self.scheduler.schedule_ahead(in_flight)
            if self._prepared is not None:
                self.rows.build(self._prepared.requests)  # a failure is found again, and reported, next step
        with self.timeline.span("wait"):
            return pending.result()

    def _device_stage(self, batch: Batch, speculative: bool) -> tuple[StepOutput, StepResult]:
        """Propose → verify → accept → launch → the one read; leaves request state alone."""
        if not speculative:
            return forward_and_sample(self.parts, batch)
        with self.timeline.span("propose"):
            proposal = self.executor.drive(self.proposer.propose(batch))
        verify = verify_chain if proposal.tree is None else verify_tree
        return verify(self.parts, batch, proposal)

    def _apply(self, batch: Batch, step_out: StepOutput, result: StepResult) -> None:
        """The step's KV growth, on the host once the step is read."""
        for b, s in enumerate(batch.seqs):
            r = s.request
            if not result.speculative:
                r.num_computed_tokens += s.num_new_tokens
                continue
            r.num_computed_tokens += 1 + result.accepted_counts[b]

    def _without_failed_rows(self, batch: Batch) -> tuple[Batch, list[RequestOutput]]:
        """The batch minus requests whose sampling rows fail to build; those finish with an error."""
        failed = self.rows.build(batch.requests)
        if not failed:
            return batch, []
        outputs = [self.abort_request(r.request_id, error) for r, error in failed.items()]
        return Batch([s for s in batch.seqs if s.request not in failed]), outputs

    # ---- commit ---------------------------------------------------------------------------

    def _commit(self, batch: Batch, step_out: StepOutput, result: StepResult) -> list[RequestOutput]:
        appended = []
        for b, r in enumerate(batch.requests):
            lp = step_out.logprobs[b] if step_out.logprobs is not None else None
            tops = step_out.top_logprobs[b] if step_out.top_logprobs is not None else None
            new = self.outputs.append(r, step_out.token_ids[b], lp, tops)
            self._advance_grammar(r, new)
            if result.speculative and step_out.proposed[b]:  # a step with nothing proposed is plain decoding
                kept = min(result.accepted_counts[b], len(new))  # drafts past a stop or max_tokens are not counted
                r.spec_stats.record(step_out.proposed[b], kept)
                self.stats.spec_stats.record(step_out.proposed[b], kept)
            if new:
                r.spec_stats.target_forwards += 1
                r.spec_stats.emitted_tokens += len(new)
                self.stats.record_tokens(len(new))
            appended.append(new)
        self.executor.drive(self.proposer.update(dataclasses.replace(result, emitted_token_ids=appended)))
        outputs = []
        for r, new in zip(batch.requests, appended):
            out = self.outputs.make_output(r, new)  # may finish r on a stop string
            if r.finished:
                self.requests.pop(r.request_id, None)
                self._retire(r)
                self.stats.record_finish(r)
            elif not self._reserved(r):
                self.pages.shrink(r.request_id, r.num_tokens)  # rejected drafts' pages go back
            outputs.append(out)
        return outputs

    def _advance_grammar(self, request: Request, tokens: list[int]) -> None:
        error = self.controls.advance(request, tokens)
        if error is not None:  # masks make this unreachable; a request never runs on off its grammar
            request.status, request.error = RequestStatus.FINISHED_ERROR, error

    def _reserved(self, request: Request) -> bool:
        """Pages for the prepared next step are held: they cover the most tokens this one emits."""
        return self._prepared is not None and any(s.request is request for s in self._prepared.seqs)

    def _retire(self, request: Request) -> None:
        self.scheduler.remove(request)
        self._preempted(request)
        self.rows.release(request.request_id)
        self.controls.release(request.request_id)

    def _preempted(self, request: Request) -> None:
        """The request left the running set: its proposer state and pool row go."""
        self.proposer.release(request)
        self.pool.release(request)


def _stop_token_ids(tokenizer, arch) -> frozenset[int]:
    """Every end-of-sequence id the checkpoint names (`speculant.loader.generation`), and its
    tokenizer's EOS."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return arch.stop_token_ids | ({eos} if eos is not None else set())
