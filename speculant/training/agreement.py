"""Teacher-forced agreement of a trained draft head with its target: where acceptance comes from.

    python -m speculant.training.agreement --head DIR --prompts FILE [--out DIR]
    python -m speculant.training.agreement --head DIR --hidden OUT/hidden [--heldout N]

With `--prompts` the target answers each prompt (a JSONL of MT-bench `turns`, whose first turn is
taken, or any prompt file train-head reads) greedily, as a greedy bench run does; the answers go
through the training precompute (the head's feature layers) and the head is scored on every
response position the way the trainer scores its held-out conversations: top-1 agreement with the
target's most likely token and KL(target || head), per draft position (from position 2 on the
head reads its own previous output). With `--hidden` it scores a training run's shards (its
held-out split with `--heldout N --seed S`, as that run drew it). Both give the same numbers for
training and evaluation text in seconds, which tells a gap of data (the head agrees less on the
evaluation text) from a mismatch of inference (acceptance below the teacher-forced agreement).
Scores are per category (`category` field) or per prompt file, and overall. Evaluation sets may be
read here: nothing is trained on them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile

import torch

from speculant.config import ModelConfig
from speculant.training.batches import SeqRef, sequence_refs
from speculant.training.data import (
    RESPONSES_FILE,
    Example,
    generate_responses,
    parse_record,
    read_responses,
)
from speculant.training.hidden import (
    HiddenOptions,
    load_shards,
    precompute,
    sequences_from_responses,
)
from speculant.training.objective import HeadObjective
from speculant.training.trainer import TrainOptions, evaluate, split_heldout

ALL = "all"


def head_objective(head_dir: pathlib.Path, target, positions: int) -> tuple[HeadObjective, TrainOptions]:
    """The head of `head_dir` in the trainer's objective (scoring `positions` draft positions), and
    the options the trainer's `evaluate` reads."""
    from speculant.loader.head_file import load_head

    head = load_head(head_dir, expect_sha256=target.sha256)
    weights = {k: v for k, v in head.weights.items() if k != "vocab_map"}
    variant, layers = head.config.variant, tuple(head.config.feature_layers or ())
    model = HeadObjective(target.arch, variant, weights, target.embed, target.lm_head, head.weights.get("vocab_map"), positions)
    return model.eval(), TrainOptions(variant=variant, feature_layers=layers, unroll=positions)


def score(model: HeadObjective, options: TrainOptions, shards: list[dict], groups: dict[str, list[SeqRef]]) -> dict[str, dict]:
    """{group: {"conversations", "target_p1", "acc_1", "kl_1", ...}} over each group's sequences;
    `target_p1`: the target's mean probability of its own most likely token where position 1 is
    scored (how predictable the text is to the target itself)."""
    with torch.no_grad():
        return {name: {"conversations": len(refs), "target_p1": _target_p1(shards, refs)}
                | {k.removeprefix("val_"): v for k, v in evaluate(model, shards, refs, options, "cpu").items()}
                for name, refs in groups.items() if refs}


def _target_p1(shards: list[dict], refs: list[SeqRef]) -> float:
    # entry i (trained where i + 1 >= prompt_len) learns the distribution stored at position i + 1
    top = [shards[r.shard]["topk_logprobs"][r.start + r.prompt_len : r.start + r.length, 0].float() for r in refs]
    return float(torch.cat(top).exp().mean())


def read_prompts(path: pathlib.Path) -> list[tuple[str, Example]]:
    """(category, example) of every line: MT-bench `turns` (the first turn) or a train-head prompt record."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record, where = json.loads(line), f"{path.stem}:{number}"
        if "turns" in record:
            example = Example(where, ({"role": "user", "content": record["turns"][0]},), None)
        else:
            example = parse_record(record, where)
        out.append((str(record.get("category", path.stem)), example))
    if not out:
        raise ValueError(f"--prompts: {path} has no prompts")
    return out


def answer(model_name: str, checkpoint, config: ModelConfig, examples: list[Example], out: pathlib.Path,
           layers: tuple[int, ...], max_new_tokens: int, batch: int) -> pathlib.Path:
    """The target's greedy answers in `out/responses.jsonl` (train-head's file, so ids label them
    by category) and their training shards in `out/hidden`, both resumed; returns the shards' folder."""
    from speculant.llm import LLM
    from speculant.sampling.params import SamplingParams

    llm = LLM(model=model_name, checkpoint=checkpoint, max_num_seqs=batch)
    generate_responses(llm, examples, out, SamplingParams(max_tokens=max_new_tokens, temperature=0.0), batch_size=batch, progress=False)
    options = HiddenOptions(feature_layers=layers)
    sequences = sequences_from_responses(read_responses(out / RESPONSES_FILE), options.max_seq_len)
    precompute(checkpoint, config, sequences, out / "hidden", options, progress=False)
    return out / "hidden"


def _groups(refs: list[SeqRef], labels: list[str | None]) -> dict[str, list[SeqRef]]:
    groups: dict[str, list[SeqRef]] = {ALL: list(refs)}
    for ref, label in zip(refs, labels):
        if label is None:
            continue
        groups.setdefault(label, []).append(ref)
    return groups


def _training_labels(hidden: pathlib.Path, refs: list[SeqRef]) -> list[str | None]:
    """Each stored conversation's prompt file or category (the id before ':' in the responses.jsonl
    beside it) when they line up, else no label."""
    rows = [r for r in read_responses(hidden.parent / RESPONSES_FILE) if r["response_ids"]]
    if len(rows) != len(refs):
        return [None] * len(refs)
    return [row["id"].rsplit(":", 1)[0] for row in rows]


def run(args: argparse.Namespace) -> dict[str, dict]:
    from speculant.executor.loading import load_checkpoint_for
    from speculant.training.target import target_tensors

    config = ModelConfig(model=args.model)
    checkpoint = load_checkpoint_for(args.model, config)
    target = target_tensors(checkpoint, args.model)
    model, options = head_objective(pathlib.Path(args.head), target, args.positions)
    if args.hidden:
        hidden = pathlib.Path(args.hidden)
    else:
        prompts = read_prompts(pathlib.Path(args.prompts))[: args.num_prompts or None]
        examples = [dataclasses.replace(ex, id=f"{c}:{n}") for n, (c, ex) in enumerate(prompts)]  # ids name the category
        out = pathlib.Path(args.out) if args.out else pathlib.Path(tempfile.mkdtemp(prefix="agreement-"))
        layers = options.layers_read(target.arch.num_layers)
        hidden = answer(args.model, checkpoint, config, examples, out, layers, args.max_tokens, args.batch)
    _, shards = load_shards(hidden)
    refs = sequence_refs(shards)
    labels = dict(zip(refs, _training_labels(hidden, refs)))
    if args.heldout:
        _, refs = split_heldout(refs, args.heldout, args.seed)
    return score(model, options, shards, _groups(refs, [labels[r] for r in refs]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speculant.training.agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--head", required=True, help="a trained head folder")
    p.add_argument("--model", default="smollm2-135m", help="its target (registry name, HF folder or .gguf)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="JSONL prompts the target answers greedily (MT-bench turns: the first)")
    src.add_argument("--hidden", help="a train-head run's hidden/ folder to score instead")
    p.add_argument("--num-prompts", type=int, default=0, help="the first N prompts (0: all)")
    p.add_argument("--max-tokens", type=int, default=64, help="answer length")
    p.add_argument("--batch", type=int, default=32, help="prompts answered together")
    p.add_argument("--out", default="", help="keep the answers' shards here (default: a temporary folder)")
    p.add_argument("--heldout", type=int, default=0, help="with --hidden: score only the trainer's held-out split of N")
    p.add_argument("--seed", type=int, default=0, help="with --heldout: the training run's seed")
    p.add_argument("--positions", type=int, default=2, help="draft positions scored")
    p.add_argument("--output", default="", help="write the scores as JSON here")
    args = p.parse_args(argv)
    from speculant.loader.errors import CheckpointError

    try:
        scores = run(args)
    except (ValueError, CheckpointError) as e:  # bad input: one clear line
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, row in scores.items():
        cols = "  ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "conversations")
        print(f"{name:<28} {row['conversations']:>5}  {cols}")
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(scores, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
