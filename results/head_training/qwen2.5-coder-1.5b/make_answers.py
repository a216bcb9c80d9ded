"""Chat conversations for the qwen2.5-coder-1.5b head from the smollm2 head's self-distilled data.

The smollm2 run's `responses.jsonl` (token ids under smollm2's ChatML template) is decoded back to
{"messages": [user, assistant]} text, which `train-head --responses dataset` re-tokenizes under
qwen's template: the 1.5B then only prefills them (features), it does not generate. The first
1,124 lines are committed as `smollm2_answers.jsonl`.

    python results/head_training/qwen2.5-coder-1.5b/make_answers.py runs/d2/responses.jsonl OUT.jsonl
"""

import json
import sys

from speculant.loader.gguf_file import GGUFFile
from speculant.loader.gguf_tokenizer import gguf_tokenizer
from speculant.loader.registry import resolve_model_path


def main(responses: str, out_path: str) -> None:
    tokenizer = gguf_tokenizer(GGUFFile(resolve_model_path("smollm2-135m")))
    with open(responses) as src, open(out_path, "w") as out:
        for line in src:
            row = json.loads(line)
            prompt = tokenizer.decode(row["prompt_ids"])
            user = prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
            answer = tokenizer.decode(row["response_ids"], skip_special_tokens=True).strip()
            if user.strip() and answer:
                messages = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
                out.write(json.dumps({"id": row["id"], "messages": messages}) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
