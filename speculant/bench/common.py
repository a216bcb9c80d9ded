"""Shared benchmark pieces: prompt sets, a transformers twin of a loaded checkpoint, reporting."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import platform
import subprocess
import time

import torch

DATA_ENV = "SPECULANT_DATA"


def data_dir() -> pathlib.Path:
    """Prompt sets: $SPECULANT_DATA, else ../shared/data beside the checkout."""
    if os.environ.get(DATA_ENV):
        return pathlib.Path(os.environ[DATA_ENV])
    return pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def load_prompts(name: str, n: int) -> list[str]:
    """The first n prompts of "mt_bench" (first turns) or "humaneval" (function stubs)."""
    if name == "mt_bench":
        lines = (data_dir() / "mt_bench" / "question.jsonl").read_text().splitlines()
        return [json.loads(line)["turns"][0] for line in lines[:n]]
    if name == "humaneval":
        with gzip.open(data_dir() / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
            return [json.loads(line)["prompt"] for _, line in zip(range(n), f)]
    raise ValueError(f"prompt set must be 'mt_bench' or 'humaneval', got {name!r}")


def hf_twin(checkpoint, dtype: torch.dtype = torch.float32):
    """A transformers model with the checkpoint's exact weights (for side-by-side runs)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    a = checkpoint.arch
    common = dict(
        vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_layers, num_attention_heads=a.num_heads, num_key_value_heads=a.num_kv_heads,
        head_dim=a.head_dim, rms_norm_eps=a.rms_norm_eps, max_position_embeddings=a.max_position,
        tie_word_embeddings=a.tie_word_embeddings, bos_token_id=a.bos_token_id, eos_token_id=a.eos_token_id,
    )
    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    if a.rope_scaling.kind == "llama3":
        s = a.rope_scaling
        rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                    high_freq_factor=s.high_freq_factor, original_max_position_embeddings=s.original_max_position)
    if a.family == "qwen2":
        config = Qwen2Config(rope_parameters=rope, **common)
    elif a.family == "qwen3":
        config = Qwen3Config(rope_parameters=rope, **common)
    elif a.family == "gemma3":
        config = _gemma3_config(a, rope, common)
    else:
        config = LlamaConfig(rope_parameters=rope, attention_bias=a.attention_bias, **common)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # assign=True: the transformers model shares the checkpoint's tensors instead of copying them
    missing, unexpected = model.load_state_dict(checkpoint.weights, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and a.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weights do not fit the transformers model: missing {missing}, unexpected {unexpected}")
    if a.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype).eval()  # assign=True kept the checkpoint's dtype


def _gemma3_config(a, rope: dict, common: dict):
    from transformers import Gemma3TextConfig

    if a.rope_scaling.kind == "linear":
        rope.update(rope_type="linear", factor=a.rope_scaling.factor)
    layer_types = ["sliding_attention" if i in a.sliding_layers else "full_attention" for i in range(a.num_layers)]
    return Gemma3TextConfig(
        rope_parameters={"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": a.local_rope_theta}},
        query_pre_attn_scalar=int(a.query_pre_attn_scalar), sliding_window=a.sliding_window, layer_types=layer_types,
        final_logit_softcapping=a.final_logit_softcap, hidden_activation="gelu_pytorch_tanh", **common,
    )  # fmt: skip


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def print_table(rows: list[dict], columns: list[str]) -> str:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)) for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def _fmt(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def write_json(path: str | pathlib.Path, payload: dict) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))


def git_commit() -> str:
    """HEAD's short hash, "+dirty" when tracked speculant/ files differ from it ("unknown" outside git)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "speculant"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
