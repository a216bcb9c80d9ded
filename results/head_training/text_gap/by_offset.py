"""Teacher-forced agreement of a head by answer offset and by prompt length, on MT-bench answers
and on a training run's held-out conversations (python -m speculant.training.agreement's scoring,
on sequences cut to each range: the earlier tokens stay context).

    python results/head_training/text_gap/by_offset.py HEAD MTBENCH_HIDDEN TRAIN_HIDDEN
"""

import dataclasses
import pathlib
import statistics
import sys

import speculant  # noqa: F401  (before torch)
from speculant.config import ModelConfig
from speculant.executor.loading import load_checkpoint_for
from speculant.training.agreement import head_objective, score
from speculant.training.batches import sequence_refs
from speculant.training.hidden import load_shards
from speculant.training.target import target_tensors
from speculant.training.trainer import split_heldout

OFFSETS = ((0, 8), (8, 16), (16, 32), (32, 64), (64, 128))
PROMPTS = ((0, 40), (40, 80), (80, 160), (160, 10_000))


def groups(refs):
    out = {}
    for a, b in OFFSETS:  # answer tokens a..b-1 scored, everything before them read
        out[f"answer[{a}:{b})"] = [dataclasses.replace(r, prompt_len=r.prompt_len + a, length=min(r.length, r.prompt_len + b))
                                   for r in refs if r.length - r.prompt_len > a + 1]
    for lo, hi in PROMPTS:
        out[f"prompt {lo}-{hi} tokens, answer[0:64)"] = [dataclasses.replace(r, length=min(r.length, r.prompt_len + 64))
                                                         for r in refs if lo <= r.prompt_len < hi]
    return out


def main(head: str, mtbench: str, train: str) -> None:
    target = target_tensors(load_checkpoint_for("smollm2-135m", ModelConfig(model="smollm2-135m")), "smollm2-135m")
    model, options = head_objective(pathlib.Path(head), target, 1)
    _, mt = load_shards(pathlib.Path(mtbench))
    _, tr = load_shards(pathlib.Path(train))
    for name, shards, refs in (("MT-bench", mt, sequence_refs(mt)), ("held-out", tr, split_heldout(sequence_refs(tr), 100, 0)[1])):
        print(f"{name}: {len(refs)} conversations, prompt median {statistics.median(r.prompt_len for r in refs)} tokens")
        for group, row in score(model, options, shards, groups(refs)).items():
            print(f"  {group:<34} {row['conversations']:>4}  target_p1 {row['target_p1']:.3f}  position 1 {row['acc_1']:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
