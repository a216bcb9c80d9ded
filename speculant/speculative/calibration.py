"""Start-up calibration of the step cost model (adaptive k), cached per machine and model shape.

Target forwards shaped like decode steps are timed at start-up (`points`, in turns: `measure`):
one sequence verifying every 1..max(k, MIN_K) + 1 tokens, batches of 8 and 32 sequences (at one
total context), and one sequence over a longer context, so that `StepCostModel`'s cost by row
count and its context coefficients are determined. The fit seeds the online model, which the
engine's measured step times then correct.
Results are cached in `$SPECULANT_CACHE/step_cost.json` under a key of the CPU, threads, torch
version, device, dtype, weights and the target's shape, so only the first start measures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from speculant.attention.batch import SeqInput
from speculant.config import ArchConfig, ModelConfig
from speculant.executor.plan import TARGET, ForwardPlan, Forwards
from speculant.kernels import native
from speculant.kv_cache.allocator import PageTables
from speculant.layers.autotune import cpu_name
from speculant.utils.json_cache import read_json, write_json
from speculant.utils.paths import cache_dir

SHORT_CONTEXT, LONG_CONTEXT = 64, 512  # tokens of context per sequence
BATCHES = (8, 32)  # sequences of the batched points (at most the scheduler's max_num_seqs)
ROUNDS = 5  # turns over a group's points (the fastest forward of each point counts)
CALIBRATION_ID = "<step cost calibration {}>"  # page-table ids of the scratch sequences
MIN_K = 8  # rows measured up to max(k, MIN_K) + 1 a sequence: engines with k <= 8 share one calibration

Sample = tuple[list[int], int, float]  # (verified tokens - 1 per sequence, context tokens, seconds)


def points(k_max: int, max_seqs: int, capacity: int, max_position: int) -> list[tuple[int, int, int]]:
    """(sequences, tokens verified per sequence, context per sequence) to time, fitting in
    `capacity` KV slots and the model's context: one sequence at every k up to k_max (the
    cost's shape in the row count matters most there), batches of 8 and 32 at k = 0, 1 and
    k_max, and one sequence over a longer context. The batches hold the same total context
    (64 and 16 tokens a sequence): at 64 each, the batch of 32 held 4x the context of the batch
    of 8, and the fit could explain its cost by context as well as by rows. Noisy single-sequence
    points then had it take context (smollm2: 16 ms per 1000 tokens, knots from 16 to 32 rows
    flat at 33-38 ms), and 17 drafts at batch 16 were priced as free (75 ms against 49 measured)."""
    short, long = (min(c, max_position - k_max - 1) for c in (SHORT_CONTEXT, LONG_CONTEXT))
    out = [(1, t, short) for t in range(1, k_max + 2)]
    for batch in dict.fromkeys(min(b, max_seqs) for b in BATCHES):
        per_seq = max(1, short * BATCHES[0] // batch)  # every batch at one total context: rows alone set them apart
        out += [(batch, t, per_seq) for t in (1, 2, k_max + 1)]
    out += [(1, t, long) for t in (1, k_max + 1)]
    return [p for p in dict.fromkeys(out) if p[2] > 0 and p[0] * (p[1] + p[2]) <= capacity]


def measure(pages: PageTables, k_max: int, max_seqs: int, max_position: int) -> Forwards[list[Sample]]:
    """Time target forwards at `points`, in scratch pages given back after. Every group of points
    that share their batch and context is prefilled once, then all points are timed in turns,
    ROUNDS times over (the fastest counts): a slow spell of the machine slows every point a
    little instead of one point a lot. Timed one after another, a 3-row verify once measured
    215 ms between 2 rows at 129 and 4 rows at 168 (k = 2 priced above k = 4); with only a
    group's points in turns, smollm2's fit took 20 ms per 1000 context tokens (a plain step at
    batch 32 priced at 150 ms against 77-92 measured), with every point in turns 9 ms (88 ms)."""
    capacity = pages.allocator.num_pages * pages.page_size
    groups: dict[tuple[int, int], list[int]] = {}  # (sequences, context) -> tokens verified, in order
    for batch, tokens, context in points(k_max, max_seqs, capacity, max_position):
        groups.setdefault((batch, context), []).append(tokens)
    held: list[tuple[int, int, list[int], list[str]]] = []  # (sequences, context, verified, scratch ids) prefilled
    fastest: dict[tuple[int, int, int], float] = {}  # (sequences, tokens, context) -> seconds
    try:
        for g, ((batch, context), verified) in enumerate(groups.items()):
            ids = [CALIBRATION_ID.format(f"{g}.{b}") for b in range(batch)]
            if not all(pages.ensure(seq, context + max(verified)) for seq in ids):
                for seq in ids:
                    pages.release(seq)
                continue  # too few pages for this group as well (a tiny cache): fit the others
            held.append((batch, context, verified, ids))
            yield ForwardPlan(TARGET, [SeqInput([0] * context, 0, pages.table(seq), logits="none") for seq in ids])
        for _ in range(ROUNDS):
            for batch, context, verified, ids in held:
                for tokens in verified:
                    step = [SeqInput([0] * tokens, context, pages.table(seq), logits="all") for seq in ids]
                    start = time.perf_counter()
                    yield ForwardPlan(TARGET, step)
                    seconds = time.perf_counter() - start
                    fastest[batch, tokens, context] = min(seconds, fastest.get((batch, tokens, context), seconds))
    finally:
        for *_, ids in held:
            for seq in ids:
                pages.release(seq)
    return [([tokens - 1] * batch, batch * context, seconds) for (batch, tokens, context), seconds in fastest.items()]


def step_cost_samples(pages: PageTables, model: ModelConfig, arch: ArchConfig, num_draft_tokens: int, max_seqs: int) -> Forwards[list[Sample]]:
    """The samples for an engine of up to `num_draft_tokens` drafts: cached for this machine and
    model shape, else measured (`measure`) and cached when any point fitted the pages."""
    k_max = calibrated_k(num_draft_tokens)
    key = cache_key(model, arch, k_max)
    samples = load_cached(key)
    if samples is None:
        samples = yield from measure(pages, k_max, max_seqs, arch.max_position)
        if samples:
            save_cached(key, samples)
    return samples


def calibrated_k(k_max: int) -> int:
    """The k a calibration measures for engines of up to `k_max` drafts: one entry serves every k
    up to MIN_K (a quantized 1.5B target takes minutes per calibration on this CPU)."""
    return max(k_max, MIN_K)


def cache_key(model: ModelConfig, arch: ArchConfig, k_max: int) -> str:
    shape = f"{arch.family}:{arch.hidden_size}x{arch.num_layers}:{arch.num_heads}/{arch.num_kv_heads}x{arch.head_dim}:{arch.intermediate_size}:{arch.vocab_size}"
    settings = f"{model.device}|{model.dtype}|{model.weights}|{model.attention_backend}|k{k_max}"
    # v8: the native kernels' source tag (v7: the batched points hold one total context)
    kernels = native.source_tag() if native.available() else "torch"
    return f"v8|{cpu_name()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}|{kernels}|{settings}|{shape}"


def load_cached(key: str) -> list[Sample] | None:
    entry = _read().get(key)
    return None if entry is None else [(list(ks), int(c), float(s)) for ks, c, s in entry]


def save_cached(key: str, samples: Sequence[Sample]) -> None:
    write_json(_path(), _read() | {key: [list(s) for s in samples]})


def _path():
    return cache_dir() / "step_cost.json"


def _read() -> dict:
    return read_json(_path())
