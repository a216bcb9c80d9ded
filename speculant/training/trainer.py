"""Train a draft head on precomputed hidden-state shards: AdamW, linear warm-up then cosine decay,
gradient clipping, checkpoints every N steps with exact resume, a CSV loss log and its PNG.

Multi-process training runs under `torchrun` (DistributedDataParallel; gloo on CPU, NCCL on
CUDA): every rank computes the same global batch plan and takes every world-th sequence of it;
the loss is normalized by the global batch's entry count, so the gradient DDP averages equals a
single process's on the whole batch. Rank 0 alone writes files.
"""

from __future__ import annotations

import math
import os
import pathlib
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from speculant.loader.head_file import HeadCheckpoint
from speculant.models.head import HEAD_VARIANTS, init_head_weights
from speculant.models.head_features import (
    FEATURE_VARIANT,
    check_feature_layers,
    default_feature_layers,
)
from speculant.training.batches import (
    BatchPlan,
    SeqRef,
    build_batch,
    sequence_refs,
    trained_entries,
)
from speculant.training.curves import CurveLog, plot_curves
from speculant.training.hidden import load_counts, load_shards
from speculant.training.objective import HeadObjective
from speculant.training.target import TargetTensors, save_trained_head, start_head, trained_start

CHECKPOINT = "checkpoint.pt"
CURVE = "train_log.csv"
PLOT = "loss.png"
HEAD_DIR = "head"
HEAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_NOT_TRAINING = ("steps", "checkpoint_every", "head_dtype")  # options a resumed run may change


@dataclass(frozen=True)
class TrainOptions:
    variant: str = "normed"
    draft_vocab: int = 0  # keep the N most frequent response tokens; 0 = the full vocabulary
    unroll: int = 1  # train unroll steps 1..S (steps >= 2 read the head's own outputs)
    steps: int = 1000
    batch_tokens: int = 2048  # head entries per optimizer step (global); longer sequences are cut
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to lr * this at the last step
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    hidden_weight: float = 0.1  # weight of the smooth-L1 regression to h_{i+1}
    seed: int = 0
    checkpoint_every: int = 100
    heldout: int = 0  # conversations kept out of training, scored every checkpoint (val_* columns)
    init_layer: int = -1  # copy the target's decoder layer N into the head's block; -1: random init
    feature_layers: tuple[int, ...] = ()  # eagle3: the target layers read; (): (2, L // 2, L - 3)
    head_dtype: str = "float32"  # the saved head file's floating tensors (training runs in fp32 alike)
    init_head: str = ""  # start from this trained head's weights (e.g. unroll-1 weights before an unrolled run)
    freeze_lm_head: bool = False  # eagle3: keep its lm_head at the target's rows (the ablation of training it)

    def __post_init__(self) -> None:
        if self.variant not in HEAD_VARIANTS:
            raise ValueError(f"variant must be one of {list(HEAD_VARIANTS)}, got {self.variant!r}")
        object.__setattr__(self, "feature_layers", tuple(self.feature_layers))  # a list read back from a checkpoint
        if self.feature_layers and self.variant != FEATURE_VARIANT:
            raise ValueError(f"feature_layers: only the {FEATURE_VARIANT} variant reads feature layers, not {self.variant!r}")
        if self.feature_layers:
            check_feature_layers(self.feature_layers)  # the range: against the target, `layers_read`
        for name in ("unroll", "steps", "batch_tokens", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("draft_vocab", "heldout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.head_dtype not in HEAD_DTYPES:
            raise ValueError(f"head_dtype must be one of {list(HEAD_DTYPES)}, got {self.head_dtype!r}")
        if self.init_layer < -1:
            raise ValueError(f"init_layer must be a layer index or -1 (random init), got {self.init_layer}")
        if self.freeze_lm_head and self.variant != FEATURE_VARIANT:
            raise ValueError(f"freeze_lm_head: only the {FEATURE_VARIANT} variant has an lm_head of its own, not {self.variant!r}")
        if self.init_head and self.init_layer >= 0:
            raise ValueError("init_head and init_layer both choose the head's starting weights; give one")


    def layers_read(self, num_layers: int) -> tuple[int, ...]:
        """The target layers an eagle3 head reads (checked against the target's `num_layers`);
        () for the variants that read the last layer's states."""
        if not self.variant_reads_features:
            return ()
        return check_feature_layers(self.feature_layers or default_feature_layers(num_layers), num_layers)

    @property
    def variant_reads_features(self) -> bool:
        return self.variant == FEATURE_VARIANT

    @property
    def regression_weight(self) -> float:
        """`hidden_weight`, or 0 for eagle3: its input is the target's feature layers, so there is
        no next state of its own kind to regress to (EAGLE-3 drops the feature loss)."""
        return 0.0 if self.variant_reads_features else self.hidden_weight


def lr_at(step: int, o: TrainOptions) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up, then cosine to the floor."""
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    progress = (step - o.warmup_steps) / max(1, o.steps - o.warmup_steps)
    return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def reduced_vocab(counts: torch.Tensor, size: int) -> torch.Tensor | None:  # [size] int64 sorted ids
    """The `size` most frequent target tokens (ties to the lower id), sorted; None for size 0."""
    if size == 0 or size >= counts.numel():
        return None
    order = torch.argsort(-counts, stable=True)
    return order[:size].sort().values


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train(
    hidden_dir: pathlib.Path, out_dir: pathlib.Path, target: TargetTensors, options: TrainOptions,
    progress: bool = True, stop_after: int | None = None, device: torch.device | None = None,
    record: dict | None = None,
) -> pathlib.Path:
    """Train (resuming from out_dir's checkpoint) and save the head; returns its folder.
    `stop_after` stops after that many optimizer steps of this call (tests of resume); `record`
    is added to the head file's training notes (the command, the data)."""
    device = device or torch.device("cpu")
    rank, world = _dist()
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest, shards = load_shards(hidden_dir)
    layers = options.layers_read(target.arch.num_layers)
    check_stored_layers(manifest, layers, hidden_dir)
    refs, heldout = split_heldout(sequence_refs(shards), options.heldout, options.seed)
    start, vocab_map = start_head(options.init_head, target, options.draft_vocab) if options.init_head else (None, reduced_vocab(load_counts(hidden_dir), options.draft_vocab))
    weights = {k: v.to(device) for k, v in start_weights(target, options, vocab_map, start).items()}
    model = HeadObjective(target.arch, options.variant, weights, target.embed.to(device), target.lm_head.to(device),
                          None if vocab_map is None else vocab_map.to(device), options.unroll, options.regression_weight)
    if options.freeze_lm_head:
        model.freeze("lm_head.weight")
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr, betas=(0.9, 0.95), weight_decay=options.weight_decay)
    start = _resume(out_dir / CHECKPOINT, model, optimizer, options, device)
    ddp_devices = [device] if device.type == "cuda" else None
    runner = torch.nn.parallel.DistributedDataParallel(model, device_ids=ddp_devices) if world > 1 else model
    plan = BatchPlan(refs, options.batch_tokens, options.seed)
    log = CurveLog(out_dir / CURVE, start) if rank == 0 else None
    end = options.steps if stop_after is None else min(options.steps, start + stop_after)
    for step in tqdm(range(start, end), initial=start, total=options.steps, desc="train", disable=not progress or rank):
        row = _train_step(runner, model, optimizer, shards, refs, plan, step, options, (rank, world, device))
        if heldout and rank == 0:
            due = (step + 1) % options.checkpoint_every == 0 or step + 1 == end
            row |= evaluate(model, shards, heldout, options, device) if due else dict.fromkeys(_val_keys(options.unroll), "")
        if log is not None:
            log.append(row)
        if rank == 0 and ((step + 1) % options.checkpoint_every == 0 or step + 1 == end):
            _save_checkpoint(out_dir / CHECKPOINT, model, optimizer, options, step + 1)
    head_dir = out_dir / HEAD_DIR
    if rank == 0:
        notes = {**asdict(options), "steps_done": end, **(record or {})}
        save_trained_head(head_dir, model, target, options.variant, notes, layers, HEAD_DTYPES[options.head_dtype])
        plot_curves({options.variant: out_dir / CURVE}, out_dir / PLOT)
    if world > 1:
        dist.barrier()
    return head_dir


def _train_step(runner, model, optimizer, shards, refs, plan, step, options, where) -> dict:
    began = time.perf_counter()
    rank, world, device = where
    indices = plan.step(step)
    batch = build_batch(shards, refs, indices[rank::world], options.batch_tokens, regress=not options.variant_reads_features).to(device)
    num_global = sum(trained_entries(refs[i], s, options.batch_tokens) for i in indices for s in range(1, options.unroll + 1))
    lr = lr_at(step, options)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss, metrics = runner(batch, num_global, world)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), options.grad_clip))
    optimizer.step()
    totals = _global_metrics(metrics, options.unroll, world)
    entries = sum(min(refs[i].length - 1, options.batch_tokens) for i in indices)
    summed = sum(totals[f"ce_{s}"] + options.regression_weight * totals[f"reg_{s}"] for s in range(1, options.unroll + 1))
    row = {"step": step + 1, "epoch": plan.epoch_of(step), "lr": lr, "loss": summed / max(num_global, 1),
           "grad_norm": grad_norm, "entries": entries, "seconds": time.perf_counter() - began}
    return row | per_entry(totals, options.unroll, ("ce", "kl", "acc", "reg"))


def per_entry(totals: dict[str, float], unroll: int, metrics: tuple[str, ...], prefix: str = "") -> dict[str, float]:
    """Summed metrics (`{m}_{s}`, with entry counts `n_{s}`) as means per trained entry, by unroll step."""
    out = {}
    for s in range(1, unroll + 1):
        n = max(totals.get(f"n_{s}", 0.0), 1.0)
        out |= {f"{prefix}{m}_{s}": totals.get(f"{m}_{s}", 0.0) / n for m in metrics}
    return out


def start_weights(target: TargetTensors, options: TrainOptions, vocab_map: torch.Tensor | None = None, start: HeadCheckpoint | None = None) -> dict[str, torch.Tensor]:
    """Fresh head weights; with `init_layer` the block is a copy of that target layer and eh_proj
    starts as [I | I] / 2, so the block first reads the mean of the (normed) token embedding and
    hidden state in the target's own residual basis, the basis the copied layer was trained on
    (eagle3: fc starts as [0 | 0 | I], the fused state the highest feature layer's).
    An eagle3 head's own lm_head starts as the target's rows of the draft vocabulary `vocab_map`;
    `start` (the `--init-head` head, see `target.start_head`) replaces them all."""
    rows = target.lm_head if vocab_map is None else target.lm_head.index_select(0, vocab_map)  # [Nk, H]
    weights = init_head_weights(target.arch, options.variant, options.seed, lm_head=rows)
    if start is not None:
        return trained_start(start, weights, (options.variant, options.layers_read(target.arch.num_layers)))
    if options.init_layer >= 0:
        eye = torch.eye(target.arch.hidden_size)
        weights |= target.layer(options.init_layer) | {"eh_proj.weight": torch.cat([eye, eye], dim=1) / 2}
        if "fc.weight" in weights:  # [hidden, 3 * hidden]: pass the last feature layer through
            weights["fc.weight"] = torch.zeros_like(weights["fc.weight"])
            weights["fc.weight"][:, -len(eye) :] = eye
    return weights


def check_stored_layers(manifest: dict, layers: tuple[int, ...], hidden_dir: pathlib.Path) -> None:
    """Refuse shards of other target layers than the head reads (`layers`; (): the last layer's)."""
    stored = tuple(manifest["settings"].get("feature_layers", ()))
    if stored != layers:
        what = lambda ls: f"feature layers {list(ls)}" if ls else "the last layer"  # noqa: E731
        raise ValueError(f"{hidden_dir}: holds the states of {what(stored)}, this head reads {what(layers)}; delete {hidden_dir} to recompute them")


def split_heldout(refs: list[SeqRef], count: int, seed: int) -> tuple[list[SeqRef], list[SeqRef]]:
    """(training, held-out) sequences: `count` of them, drawn by `seed`, kept out of training."""
    if count == 0:
        return refs, []
    if count >= len(refs):
        raise ValueError(f"heldout: {count} conversations held out of {len(refs)}; none would be left to train on")
    order = torch.randperm(len(refs), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    chosen = set(order[:count])
    return [r for i, r in enumerate(refs) if i not in chosen], [refs[i] for i in sorted(chosen)]


_VAL_METRICS = ("kl", "acc")


def _val_keys(unroll: int) -> list[str]:  # the columns `evaluate` fills, in its order
    return list(per_entry({}, unroll, _VAL_METRICS, "val_"))


@torch.no_grad()
def evaluate(model: HeadObjective, shards, refs: list[SeqRef], options: TrainOptions, device) -> dict[str, float]:
    """KL(target || head) and top-1 agreement per unrolled position over held-out sequences."""
    plan = BatchPlan(refs, options.batch_tokens, options.seed)
    totals: dict[str, float] = {}
    for indices in plan.in_order():
        batch = build_batch(shards, refs, indices, options.batch_tokens, regress=not options.variant_reads_features)
        _, metrics = model(batch.to(device), 1)
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v
    return per_entry(totals, options.unroll, _VAL_METRICS, "val_")


def _global_metrics(metrics: dict[str, float], unroll: int, world: int) -> dict[str, float]:
    keys = [f"{m}_{s}" for s in range(1, unroll + 1) for m in ("ce", "kl", "reg", "acc", "n")]
    values = torch.tensor([metrics.get(k, 0.0) for k in keys], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def _save_checkpoint(path: pathlib.Path, model, optimizer, options: TrainOptions, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "params": model.state_dict(), "optim": optimizer.state_dict(), "options": asdict(options)}, tmp)
    os.replace(tmp, path)


def _resume(path: pathlib.Path, model, optimizer, options: TrainOptions, device: torch.device) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True, map_location=device)
    now = {k: v for k, v in asdict(options).items() if k not in _NOT_TRAINING}
    # an option newer than the checkpoint reads as its default (what that run trained with)
    saved = {k: v for k, v in asdict(TrainOptions()).items() if k in now} | {k: v for k, v in state["options"].items() if k not in _NOT_TRAINING}
    saved["feature_layers"] = tuple(saved["feature_layers"])  # a list read back, as __post_init__ notes
    if saved != now:
        changed = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
        raise ValueError(f"{path}: a checkpoint of other training options {changed} (old, new); use another --out")
    model.load_state_dict(state["params"])
    optimizer.load_state_dict(state["optim"])
    return int(state["step"])
