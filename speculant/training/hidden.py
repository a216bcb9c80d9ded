"""Precompute what head training reads from the target, with the engine's own model code.

Each conversation (prompt + response token ids from `responses.jsonl`) runs as a prefill through
`Executor.run` with logits for every token. Per token we keep the last-layer hidden state before
the final norm (bf16) and the target's next-token distribution as its top-K ids and log-probs.
For an eagle3 head (`feature_layers`) the executor exposes the target's feature layers, as it does
at inference (`Executor.expose_features`), and `hidden` holds those layers' states instead.
Sequences are written in order as safetensors shards of about `shard_tokens` tokens:

    tokens [T] int32, hidden [T, H] bf16 ([T, 3H] feature layers), topk_ids [T, K] int32,
    topk_logprobs [T, K] fp16, cu_seqlens [B + 1] int64, prompt_lens [B] int64

`manifest.json` lists finished shards and the layers stored; a rerun keeps them and continues
from the next sequence (one made for other layers is refused: delete the folder to recompute). A
data set grown by appending conversations extends the shards: the stored ones are checked to be its
first sequences, token for token, and only the new ones run.
`token_counts.safetensors` holds how often each target token occurs in the responses, so the
trainer can keep the N most frequent as a reduced draft vocabulary for any N.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from dataclasses import asdict, dataclass

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan

MANIFEST = "manifest.json"
COUNTS = "token_counts.safetensors"
_MAX_SEQS_PER_FORWARD = 64


@dataclass(frozen=True)
class HiddenOptions:
    top_k: int = 32  # target distribution kept per token
    max_seq_len: int = 1024  # longer conversations are cut (their response's end is dropped)
    forward_tokens: int = 1024  # tokens per prefill forward (sequences packed up to this)
    shard_tokens: int = 65536  # tokens per shard file
    page_size: int = 16
    feature_layers: tuple[int, ...] = ()  # the target layers stored per token (eagle3); (): the last layer


@dataclass(frozen=True)
class Sequence:
    tokens: list[int]
    prompt_len: int


def sequences_from_responses(rows: list[dict], max_seq_len: int) -> list[Sequence]:
    """prompt + response ids of each row, cut to max_seq_len; rows with no response are skipped."""
    out = []
    for row in rows:
        prompt, response = row["prompt_ids"], row["response_ids"]
        if response and len(prompt) + 1 < max_seq_len:
            out.append(Sequence((prompt + response)[:max_seq_len], len(prompt)))
    return out


def count_tokens(sequences: list[Sequence], vocab_size: int) -> torch.Tensor:  # [vocab] int64
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in sequences:
        counts += torch.bincount(torch.tensor(seq.tokens[seq.prompt_len :]), minlength=vocab_size)
    return counts


class TargetPrefill:
    """The target as the engine runs it, for prefill forwards over whole conversations."""

    def __init__(self, checkpoint, model_config: ModelConfig, options: HiddenOptions) -> None:
        self.executor = Executor(build_runner(checkpoint, model_config))
        if options.feature_layers:  # the features an eagle3 head reads, by the inference path
            self.executor.expose_features(TARGET, options.feature_layers)
        self.options = options
        ps = options.page_size
        pages = math.ceil((options.forward_tokens + options.max_seq_len) / ps) + _MAX_SEQS_PER_FORWARD
        self.executor.allocate_kv(pages, ps)

    def run(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [T, H] (or [T, 3H] feature layers), topk_ids [T, K], topk_logprobs [T, K] over
        the sequences concatenated."""
        inputs, next_page, ps = [], 0, self.options.page_size
        for seq in seqs:
            n = math.ceil(len(seq.tokens) / ps)
            inputs.append(SeqInput(seq.tokens, 0, list(range(next_page, next_page + n)), logits="all"))
            next_page += n
        result = self.executor.run(ForwardPlan(TARGET, inputs))
        logprobs = torch.log_softmax(result.logits, dim=-1)  # [T, vocab]
        top = logprobs.topk(self.options.top_k, dim=-1)
        return result.hidden, top.indices, top.values


def precompute(
    checkpoint, model_config: ModelConfig, sequences: list[Sequence], out_dir: pathlib.Path,
    options: HiddenOptions = HiddenOptions(), progress: bool = True, stop_after_shards: int | None = None,
) -> dict:
    """Write the shards (resuming), then the token counts; returns the manifest.
    `stop_after_shards` stops early after writing that many new shards (tests of resume)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _open_manifest(out_dir, checkpoint, model_config, options, sequences)
    if manifest["complete"]:
        return manifest
    start = sum(s["num_seqs"] for s in manifest["shards"])
    prefill = TargetPrefill(checkpoint, model_config, options) if start < len(sequences) else None
    total_tokens = sum(len(s.tokens) for s in sequences)
    done_tokens = sum(s["num_tokens"] for s in manifest["shards"])
    written = 0
    with tqdm(total=total_tokens, initial=done_tokens, desc="hidden", unit="tok", disable=not progress) as bar:
        for group in _shard_groups(sequences, start, options.shard_tokens):
            if stop_after_shards is not None and written >= stop_after_shards:
                return manifest
            _write_shard(out_dir, manifest, prefill, group, start, bar)
            start += len(group)
            written += 1
    save_file({"counts": count_tokens(sequences, checkpoint.arch.vocab_size)}, str(out_dir / COUNTS))
    manifest["complete"] = True
    _save_json(out_dir / MANIFEST, manifest)
    return manifest


def _open_manifest(out_dir, checkpoint, model_config, options, sequences: list[Sequence]) -> dict:
    settings = {
        "model": model_config.model, "dtype": model_config.dtype, "num_sequences": len(sequences),
        "hidden_size": checkpoint.arch.hidden_size, "vocab_size": checkpoint.arch.vocab_size, **asdict(options),
    }
    settings["feature_layers"] = list(options.feature_layers)  # as JSON reads it back
    path = out_dir / MANIFEST
    if path.exists():
        manifest = json.loads(path.read_text())
        stored = manifest["settings"].setdefault("feature_layers", [])  # absent: made before eagle3, the last layer's
        if stored != settings["feature_layers"]:
            what = lambda ls: f"feature layers {ls}" if ls else "the last layer"  # noqa: E731
            raise ValueError(f"{path}: holds the states of {what(stored)}, this run needs {what(settings['feature_layers'])}; delete {out_dir} to recompute them")
        changed = {k: (manifest["settings"].get(k), v) for k, v in settings.items() if manifest["settings"].get(k) != v}
        changed.pop("forward_tokens", None)  # batching does not change what is stored
        grown = changed.pop("num_sequences", None)
        if changed:
            raise ValueError(f"{path}: made with other settings {changed} (old, new); use another --out or delete it")
        if grown:
            _check_prefix(out_dir, manifest, sequences)
            manifest["settings"]["num_sequences"], manifest["complete"] = len(sequences), False
        return manifest
    return {"settings": settings, "shards": [], "complete": False}


def _check_prefix(out_dir: pathlib.Path, manifest: dict, sequences: list[Sequence]) -> None:
    """A grown data set (more conversations appended) extends the stored shards, which must hold
    its first sequences, token for token; anything else is refused."""
    stored = manifest["settings"]["num_sequences"]
    if len(sequences) < stored:
        raise ValueError(f"{out_dir}: holds {stored} conversations, this run has {len(sequences)}; delete {out_dir} to recompute")
    for shard in manifest["shards"]:
        with safe_open(str(out_dir / shard["file"]), framework="pt") as f:  # the ids only, not the states
            tokens, cu, prompts = (f.get_tensor(k).tolist() for k in ("tokens", "cu_seqlens", "prompt_lens"))
        for b, seq in enumerate(sequences[shard["first"] : shard["first"] + shard["num_seqs"]]):
            if tokens[cu[b] : cu[b + 1]] != seq.tokens or prompts[b] != seq.prompt_len:
                raise ValueError(f"{out_dir}: conversation {shard['first'] + b} differs from the stored one "
                                 f"(only appending conversations extends the shards); delete {out_dir} to recompute")


def _shard_groups(sequences: list[Sequence], start: int, shard_tokens: int):
    group, tokens = [], 0
    for seq in sequences[start:]:
        group.append(seq)
        tokens += len(seq.tokens)
        if tokens >= shard_tokens:
            yield group
            group, tokens = [], 0
    if group:
        yield group


def _write_shard(out_dir, manifest, prefill: TargetPrefill, group: list[Sequence], first: int, bar) -> None:
    parts = []
    for chunk in _forward_chunks(group, prefill.options.forward_tokens):
        parts.append(prefill.run(chunk))
        bar.update(sum(len(s.tokens) for s in chunk))
    lengths = torch.tensor([len(s.tokens) for s in group])
    tensors = {
        "tokens": torch.tensor([t for s in group for t in s.tokens], dtype=torch.int32),
        "hidden": torch.cat([p[0] for p in parts]).to(torch.bfloat16),
        "topk_ids": torch.cat([p[1] for p in parts]).to(torch.int32),
        "topk_logprobs": torch.cat([p[2] for p in parts]).clamp(min=-1e4).to(torch.float16),
        "cu_seqlens": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
        "prompt_lens": torch.tensor([s.prompt_len for s in group], dtype=torch.int64),
    }
    name = f"shard-{len(manifest['shards']):05d}.safetensors"
    tmp = out_dir / (name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, out_dir / name)
    manifest["shards"].append({"file": name, "first": first, "num_seqs": len(group), "num_tokens": int(lengths.sum())})
    _save_json(out_dir / MANIFEST, manifest)


def _forward_chunks(group: list[Sequence], forward_tokens: int):
    chunk, tokens = [], 0
    for seq in group:
        if chunk and (tokens + len(seq.tokens) > forward_tokens or len(chunk) >= _MAX_SEQS_PER_FORWARD):
            yield chunk
            chunk, tokens = [], 0
        chunk.append(seq)
        tokens += len(seq.tokens)
    if chunk:
        yield chunk


def _save_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# ---- reading ---------------------------------------------------------------------------------


def load_shards(folder: pathlib.Path) -> tuple[dict, list[dict]]:
    """(manifest, shard tensors) of a complete precompute."""
    manifest = json.loads((folder / MANIFEST).read_text())
    if not manifest.get("complete"):
        raise ValueError(f"{folder}: the hidden-state precompute is not finished; rerun it to resume")
    return manifest, [load_file(str(folder / s["file"])) for s in manifest["shards"]]


def load_counts(folder: pathlib.Path) -> torch.Tensor:  # [vocab] int64
    return load_file(str(folder / COUNTS))["counts"]
