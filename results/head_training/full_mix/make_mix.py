"""One data file for the full smollm2 mix: the passage-task run's conversations first, in the
order its run read them (so its answers and features are reused: the features stage extends
stored shards when the data set keeps them as its first sequences), then the shipped head's
other prompts (GSM8K train's first 1,200, the drawn instructions, the drawn open questions),
interleaved.

    python results/head_training/full_mix/make_mix.py runs/p1 runs/f1

Writes OUT/mix.jsonl and OUT/responses.jsonl (the passage run's answers under their new ids).
"""

from __future__ import annotations

import json
import pathlib
import sys

from speculant.training.data import load_examples, read_responses

ROOT = pathlib.Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "data" / "train"
PASSAGE_RUN_FILES = ["passage_tasks.jsonl", str(ROOT / "data/prompts/diverse.jsonl"), str(SHARED / "self_instruct_user_oriented.jsonl")]
OTHERS = [str(SHARED / "gsm8k_train.jsonl"), str(ROOT / "results/head_training/instruction_prompts.jsonl")]
GSM8K_FIRST = 1200
SELF_PROMPTS = ROOT / "results/head_training/self_prompts.jsonl"


def main(passage_run: pathlib.Path, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    first = load_examples([passage_run / PASSAGE_RUN_FILES[0], *PASSAGE_RUN_FILES[1:]])
    gsm8k = [json.loads(line) for line in open(OTHERS[0], encoding="utf-8")][:GSM8K_FIRST]
    gsm8k_path = out / "gsm8k_first.jsonl"
    gsm8k_path.write_text("".join(json.dumps(r) + "\n" for r in gsm8k))
    drawn = [json.loads(line) for line in open(SELF_PROMPTS, encoding="utf-8")]
    drawn_path = out / "drawn_questions.jsonl"
    drawn_path.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in drawn if r["prompt"]))
    rest = load_examples([gsm8k_path, OTHERS[1], drawn_path])  # round-robin: a --max-prompts cut keeps all three
    records = [{"messages": list(ex.messages)} for ex in first + rest]
    (out / "mix.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    new_id = {ex.id: f"mix:{i + 1}" for i, ex in enumerate(first)}
    rows = [dict(r, id=new_id[r["id"]]) for r in read_responses(passage_run / "responses.jsonl") if r["id"] in new_id]
    (out / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(records)} conversations ({len(first)} answered already, {len(rows)} answers carried over)")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
