"""The second qwen2.5-coder-1.5b run's prompt file: the 1,124 smollm2-answered conversations of
`smollm2_answers.jsonl` (answered), then user-only prompts the 1.5B answers itself
(`train-head --responses self` generates only those: the answered ones are already in the run's
`responses.jsonl`, copied from the first run). The new prompts take turns from the shipped
smollm2 head's sources, leaving out the ones the first 1,124 already hold:

    head -n 1200 ../shared/data/train/gsm8k_train.jsonl > runs/q15/gsm8k_train.jsonl
    python results/head_training/qwen2.5-coder-1.5b/make_own_prompts.py runs/q15/gsm8k_train.jsonl runs/q15/b/smol_answers.jsonl

The output keeps the name `smol_answers.jsonl`: example ids are "<file stem>:<line>", so the
first 1,124 keep the ids of the first run's responses and features.
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
SOURCES = ("results/head_training/instruction_prompts.jsonl", "data/prompts/diverse.jsonl", None, "results/head_training/self_prompts.jsonl")  # None: the GSM8K file given


def main(gsm8k: str, out_path: str, count: int = 2048) -> None:
    answered = (HERE / "smollm2_answers.jsonl").read_text().splitlines()
    used = {json.loads(line)["id"] for line in answered}
    sources = [list(_prompts(pathlib.Path(path or gsm8k), used)) for path in SOURCES]
    mixed = [s[i] for i in range(max(map(len, sources))) for s in sources if i < len(s)]
    with open(out_path, "w") as out:
        out.writelines(line + "\n" for line in answered)
        out.writelines(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n" for text in mixed[:count])


def _prompts(path: pathlib.Path, used: set[str]):
    for number, line in enumerate(path.open(), 1):
        record = json.loads(line)
        text = record.get("prompt") or record.get("question") or record.get("instruction")
        if text and f"{path.stem}:{number}" not in used:
            yield text


if __name__ == "__main__":
    main(*sys.argv[1:3])
