"""The memory plan: every byte the engine keeps, and every byte a step may allocate, counted
before the KV cache is allocated, so that the KV pages can be sized from what a budget leaves.

Notation: B = max_num_seqs, k = num_draft_tokens (0 without speculation), V = the vocabulary,
N = B * (k + 1) target rows whose logits one step computes, T = max(max_num_batched_tokens, N)
tokens in the largest forward, L = max_position keys per sequence. fp32 = 4 bytes; `elt` is a
model's dtype size. Each item's formula sits next to its field (a forward's activations and
attention workspace per model family in `speculant.engine.activation_memory`; the free memory a
fractional budget reads in `speculant.utils.device_memory`); the figures were read off the
code they describe and are checked against measured process memory in tests/engine/test_memory.py.

The transient items (verify, sampling, activations, attention) never all live at once; they
are still summed, so `total` bounds the peak from above rather than estimating it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from speculant.config import CacheConfig, EngineConfig
from speculant.engine.activation_memory import FP32, activation_bytes, largest_step_attention
from speculant.executor.executor import Executor
from speculant.executor.model_runner import ModelRunner
from speculant.executor.plan import TARGET
from speculant.speculative.base import Proposer
from speculant.utils.device_memory import free_device_bytes
from speculant.utils.tensor_bytes import largest_packed_bytes, tensor_bytes

MIB = 1 << 20
# [N, V] fp32-sized buffers live at once besides the logits while the target probabilities are
# built (`processed_probs` with top-k/top-p): the scaled logits (1), the sorted values (1) and
# their int64 order (2), the sorted probabilities, their cumsum and the mass before each token
# (3), bool masks (1/4 each). Measured with N = 80, V = 32,000: 7.5 (the padded target probs,
# counted in `verify`, included); acceptance's [B, V] buffers come after these are freed.
SAMPLING_ROWS = 7


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes by item. `total` is their sum."""

    target_weights: int  # the target's tensors as loaded (weights, fused projections, rotary tables)
    draft_weights: int  # the same for every other model of the engine (a draft LLM)
    kv_cache: int  # num_pages * bytes per page summed over every model writing the pages
    draft_logits: int  # a draft model's carried logits: [B, V] fp32
    draft_probs: int  # sampled drafts' distributions, alive through verification: [B, k, V] fp32
    verify: int  # target logits [N, V] fp32, plus the padded target probs [B, k + 1, V] fp32 when k > 0
    sampling: int  # SAMPLING_ROWS * [N, V] fp32: temporaries of the processed target probs
    activations: int  # one forward's layer activations at T tokens (max over models)
    # Each model's attention backend workspace for the largest step, summed: FlashInfer keeps
    # one per backend; the torch reference's are transient, so the sum overcounts by the smaller.
    attention: int
    # oneDNN's inner product on a pre-packed weight takes a transient workspace of up to that
    # weight's size per call (measured: ~30 MiB more peak with a 32 MiB packed head): the largest
    # packed weight of any model (forwards run one at a time); 0 when no layer uses oneDNN.
    kernel_workspace: int = 0
    num_pages: int = dataclasses.field(default=0, metadata={"bytes": False})  # KV pages (a count)

    @property
    def total(self) -> int:
        return sum(self.as_items().values())

    def as_items(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("bytes", True)}

    def as_dict(self) -> dict[str, int]:
        """Bytes by item, with "total"."""
        return {**self.as_items(), "total": self.total}

    def describe(self) -> str:
        """One line per item in MiB, for people."""
        return "\n".join(f"  {name:<15}{value / MIB:>10.1f} MiB" for name, value in self.as_dict().items())


def plan_engine(config: EngineConfig, executor: Executor, proposer: Proposer, budget: int | None) -> MemoryPlan:
    """The plan with the KV pages sized: by `num_pages`, else what `budget` (bytes) leaves after
    every other item, else `kv_cache_bytes`."""
    cache = config.cache
    target = executor.runner(TARGET)
    drafts = [executor.runner(name) for name in executor.model_names if name != TARGET]
    extra = proposer.memory_bytes(config.scheduler.max_num_seqs)
    per_page = kv_bytes_per_page([target, *drafts], cache.page_size)
    # One sequence at the full context, plus the k drafts and the bonus slot a step may write.
    min_pages = -(-(target.arch.max_position + config.speculative.num_draft_tokens + 1) // cache.page_size)
    exposed = len(executor.exposed_layers(TARGET))
    num_pages = kv_pages(cache, plan_memory(config, target, drafts, extra, 0, exposed), per_page, budget, min_pages)
    plan = plan_memory(config, target, drafts, extra, num_pages, exposed)
    check_budget(plan, budget)
    return plan


def plan_memory(
    config: EngineConfig, target: ModelRunner, drafts: list[ModelRunner], proposer_bytes: dict[str, int], num_pages: int,
    exposed_layers: int = 0,
) -> MemoryPlan:
    """The plan for `num_pages` KV pages; `proposer_bytes` holds the proposer's own items;
    `exposed_layers`: the feature layers the target's forwards expose (an eagle3 head's)."""
    sched, k = config.scheduler, config.speculative.num_draft_tokens if config.speculative.enabled else 0
    batch, vocab = sched.max_num_seqs, target.arch.vocab_size
    rows = batch * (k + 1)  # N
    tokens = max(sched.max_num_batched_tokens, rows)  # T
    runners = [target, *drafts]
    return MemoryPlan(
        target_weights=tensor_bytes(target.model),
        draft_weights=tensor_bytes([target.model, *(r.model for r in drafts)]) - tensor_bytes(target.model),  # a head's shared tensors count once
        kv_cache=num_pages * kv_bytes_per_page(runners, config.cache.page_size),
        draft_logits=proposer_bytes.get("draft_logits", 0),
        draft_probs=proposer_bytes.get("draft_probs", 0),
        verify=rows * vocab * FP32 * (2 if k else 1),
        sampling=SAMPLING_ROWS * rows * vocab * FP32,
        activations=max([activation_bytes(target, tokens, exposed_layers), *(activation_bytes(r, tokens) for r in drafts)]),
        attention=sum(largest_step_attention(r, config, k) for r in runners),
        kernel_workspace=max(largest_packed_bytes(r.model) for r in runners),
        num_pages=num_pages,
    )


def kv_bytes_per_page(runners: list[ModelRunner], page_size: int) -> int:
    return sum(r.kv_bytes_per_page(page_size) for r in runners)


# ---- sizing the KV pages -----------------------------------------------------------------


def resolve_budget(budget: float | None, device: torch.device) -> int | None:
    """`CacheConfig.memory_budget` in bytes: as given, or a fraction of the device's free
    memory now (CUDA: `torch.cuda.mem_get_info`; CPU: MemAvailable of /proc/meminfo)."""
    if budget is None:
        return None
    if budget > 1:
        return int(budget)
    return int(budget * free_device_bytes(device))


def kv_pages(cache: CacheConfig, rest: MemoryPlan, per_page: int, budget: int | None, min_pages: int) -> int:
    """Pages of the KV cache. `num_pages`, when set, wins; else a memory budget, when set, gives
    the KV what the rest of the plan leaves and must leave at least `min_pages` (one sequence
    of the model's full context plus its lookahead); else `kv_cache_bytes` is the KV budget."""
    if cache.num_pages is not None:
        return cache.num_pages
    if budget is None:
        return max(1, cache.kv_cache_bytes // per_page)
    pages = (budget - rest.total) // per_page
    if pages < min_pages:
        raise ValueError(
            f"memory_budget of {budget / MIB:.1f} MiB is too small: it must cover "
            f"{rest.total / MIB:.1f} MiB for weights and workspaces ({_largest_items(rest)}) plus "
            f"{min_pages * per_page / MIB:.1f} MiB of KV cache for one full-context sequence "
            f"({min_pages} pages of {per_page} bytes), {(rest.total + min_pages * per_page) / MIB:.1f} MiB in all"
        )
    return pages


def check_budget(plan: MemoryPlan, budget: int | None) -> None:
    """A plan with the KV fixed by `num_pages` must still fit a memory budget set beside it."""
    if budget is not None and plan.total > budget:
        raise ValueError(
            f"memory_budget of {budget / MIB:.1f} MiB is too small for the plan's {plan.total / MIB:.1f} MiB "
            f"({_largest_items(plan)})"
        )


def _largest_items(plan: MemoryPlan) -> str:
    items = sorted(((v, n) for n, v in plan.as_items().items() if v), reverse=True)
    return ", ".join(f"{name} {value / MIB:.1f} MiB" for value, name in items)
