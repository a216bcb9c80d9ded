"""Validation through the engine: real MTP generation with the trained head on held-aside prompts,
reporting τ and acceptance by draft position (no forward of its own)."""

from __future__ import annotations

import json
import pathlib

from speculant.sampling.params import SamplingParams
from speculant.training.data import Example, prompt_ids

VALIDATION_FILE = "validation.json"


def validate_head(
    model: str, checkpoint, head_dir: pathlib.Path, examples: list[Example], num_draft_tokens: int,
    max_new_tokens: int, progress: bool = True,
) -> dict:
    """Greedy MTP generation of every example; τ and acceptance from `llm.stats()`."""
    from speculant.llm import LLM

    llm = LLM(model=model, checkpoint=checkpoint, speculative="mtp", head=str(head_dir), num_draft_tokens=num_draft_tokens)
    prompts = [prompt_ids(llm.tokenizer, ex) for ex in examples]
    llm.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0.0), use_tqdm=progress)
    stats = llm.stats()
    return {
        "num_prompts": len(examples),
        "num_draft_tokens": num_draft_tokens,
        "tau": stats["tau"],
        "acceptance_rate": stats["acceptance_rate"],
        "acceptance_by_position": stats["acceptance_by_position"],
        "generated_tokens": stats["generated_tokens"],
        "tokens_per_s": stats["tokens_per_s"],
    }


def write_validation(out_dir: pathlib.Path, results: list[dict]) -> pathlib.Path:
    path = out_dir / VALIDATION_FILE
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def describe(result: dict) -> str:
    by_pos = ", ".join(f"{a:.2f}" for a in result["acceptance_by_position"])
    return f"k={result['num_draft_tokens']}: tau {result['tau']:.2f}, acceptance by position [{by_pos}] over {result['num_prompts']} prompts"
