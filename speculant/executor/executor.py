"""The executor: the one place model forwards run.

It owns every model runner of the engine (the target, and the models proposers declare, which
`speculant.executor.loading` builds and checks), sizes and allocates their K/V over the shared
pages, and runs `ForwardPlan`s: the engine's own target forwards with `run`, a proposer's chain
of dependent forwards with `drive`. On one rank this is
a loop; with tensor parallelism the leader's subclass (`speculant.distributed.leader`) broadcasts
each forward so every rank enters it together; it is also where a schedule would launch forwards
ahead of the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from speculant.attention.batch import ForwardBatch, build_forward_batch
from speculant.config import ArchConfig
from speculant.executor.loading import (
    build_head_runner,
    checked_head,
    load_model_runner,
    own_head_runner,
)
from speculant.executor.model_runner import ModelRunner
from speculant.executor.plan import TARGET, ForwardPlan, ForwardResult, Forwards, ModelSpec, T


class Executor:
    def __init__(self, target: ModelRunner, target_sha256: Callable[[], str] | None = None) -> None:
        self._runners: dict[str, ModelRunner] = {TARGET: target}
        self._target_sha256 = target_sha256  # the target checkpoint's sha256, for heads trained on it
        self.page_size: int | None = None  # set by allocate_kv
        self._features: dict[str, tuple[int, ...]] = {}  # model -> layers its forwards expose as `hidden`
        self.timeline = None  # the engine's `Timeline`: each forward is a span of it

    # ---- models -----------------------------------------------------------------------------

    def add_model(self, spec: ModelSpec) -> None:
        """Own a model a proposer declared (before `allocate_kv`), loaded and checked by
        `speculant.executor.loading`."""
        if spec.name in self._runners:
            raise ValueError(f"model name {spec.name!r} is already in use")
        if self.page_size is not None:
            raise RuntimeError("add_model after allocate_kv: the page budget is already fixed")
        if spec.head_of is not None:
            self._runners[spec.name] = self._head_runner(spec)
            return
        self._runners[spec.name] = load_model_runner(spec, self.arch().vocab_size)

    def _head_runner(self, spec: ModelSpec) -> ModelRunner:
        """A head over its base model's runner (the tensor-parallel leader's also reaches every rank)."""
        base = self._runner(spec.head_of)
        if spec.own_head:
            return own_head_runner(base, spec.config)
        head = self._checked_head(spec, base)
        if head.config.feature_layers:  # an eagle3 head: the base's forwards expose those layers
            self.expose_features(spec.head_of, head.config.feature_layers)
        return build_head_runner(head, base, spec.config)

    def _checked_head(self, spec: ModelSpec, base: ModelRunner):
        """`loading.checked_head`, with the target's sha256 for a head over the target."""
        expect = self._target_sha256() if self._target_sha256 is not None and spec.head_of == TARGET else None
        return checked_head(spec, base, expect)

    def expose_features(self, model: str, layers: tuple[int, ...]) -> None:
        """From now on `model`'s forwards return as `hidden` its residual stream after each of
        `layers`, concatenated ([T, len(layers) * hidden], `CausalLM.forward_features`), in place
        of its last layer's states: what an eagle3 head reads. Logits are unchanged."""
        layers, family = tuple(layers), self.arch(model).family
        if not self._runner(model).model.exposes_layers:
            raise ValueError(f"feature_layers: the {family} model exposes no layer outputs (eagle3 heads read Llama-family targets)")
        if self._features.get(model, layers) != layers:
            raise ValueError(f"feature_layers: the {model} model already exposes layers {list(self._features[model])}, not {list(layers)}")
        self._features[model] = layers

    def exposed_layers(self, model: str) -> tuple[int, ...]:
        """The feature layers `model`'s forwards expose (`expose_features`); () for none."""
        return self._features.get(model, ())

    def add_runner(self, name: str, runner: ModelRunner) -> None:
        """Own an already built runner (a tensor-parallel worker's head shard)."""
        self._runners[name] = runner

    @property
    def model_names(self) -> list[str]:
        return list(self._runners)

    def arch(self, model: str = TARGET) -> ArchConfig:
        return self._runner(model).arch

    def runner(self, model: str = TARGET) -> ModelRunner:
        """A model's runner, for inspecting its K/V (tests); forwards go through `run`."""
        return self._runner(model)

    def _runner(self, model: str) -> ModelRunner:
        if model not in self._runners:
            raise KeyError(f"no model {model!r}; the executor runs {self.model_names}")
        return self._runners[model]

    # ---- K/V over the shared pages ------------------------------------------------------------

    def kv_bytes_per_page(self, page_size: int) -> int:
        """Bytes one page costs, summed over every model that writes K/V into it."""
        return sum(r.kv_bytes_per_page(page_size) for r in self._runners.values())

    def allocate_kv(self, num_pages: int, page_size: int) -> None:
        for runner in self._runners.values():
            runner.allocate_kv(num_pages, page_size)
        self.page_size = page_size

    def move_kv(self, model: str, src_slots, dst_slots) -> None:
        """Copy a model's K/V at cache slots `src_slots` [M] to `dst_slots` [M] (device int64),
        every layer; all sources are read before any destination is written (`KVCache.move`)."""
        self._runner(model).kv.move(src_slots, dst_slots)

    # ---- forwards ---------------------------------------------------------------------------------

    def run(self, plan: ForwardPlan) -> ForwardResult:
        """One forward of `plan.model` over `plan.inputs`."""
        assert self.page_size is not None, "allocate_kv first"
        with self.span(plan.model):
            fb = build_forward_batch(plan.inputs, self.page_size)
            return self.forward_batch(plan.model, fb, plan.input_ids, plan.input_embeds, plan.hidden_states, plan.logits_rows)

    def span(self, model: str):
        """The timeline span of one forward of `model` (nothing without a timeline)."""
        return self.timeline.span(f"forward:{model}") if self.timeline is not None else contextlib.nullcontext()

    def forward_batch(
        self, model: str, fb: ForwardBatch, input_ids=None, input_embeds=None, hidden_states=None, logits_rows=None,
    ) -> ForwardResult:
        """One forward of `model` over a built batch (`ForwardPlan`'s tensors, same shapes)."""
        features = self._features.get(model, ())
        logits, hidden = self._runner(model).forward(fb, input_embeds, hidden_states, input_ids, logits_rows, features)
        return ForwardResult(logits, hidden)

    def drive(self, forwards: Forwards[T]) -> T:
        """Run a proposer's plans one by one, sending each result back; returns what it returns."""
        try:
            plan = next(forwards)
            while True:
                plan = forwards.send(self.run(plan))
        except StopIteration as done:
            return done.value

    def close(self) -> None:
        """Release what outlives the process's objects (tensor-parallel workers); idempotent."""

