"""Test kit: tiny random Hugging Face models that the tests build themselves, and statistics.

Import as `from testkit import ...` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import torch


def tiny_hf_config(kind: str = "llama", vocab_size: int = 256, **overrides):
    """A small transformers config of the given kind: "llama", "qwen2" (q/k/v bias) or "tied"."""
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    common.update(overrides)
    if kind == "qwen2":
        return Qwen2Config(tie_word_embeddings=False, rope_theta=10000.0, **common)
    return LlamaConfig(tie_word_embeddings=(kind == "tied"), **common)


def tiny_hf_model(kind: str = "llama", seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(kind, **overrides), dtype=torch.float32)
    with torch.no_grad():  # random init has tiny weights; widen them so logits are not all near-ties
        for p in model.parameters():
            p.normal_(0, 0.08 if p.dim() > 1 else 0.3).add_(1.0 if p.dim() == 1 else 0.0)
    return model.eval()


def noisy_copy(hf_model, scale: float = 0.02, seed: int = 1):
    """A weak draft for `hf_model`: its weights plus Gaussian noise, so drafts are accepted
    sometimes, rejected often (a random draft is almost never right)."""
    import copy

    draft = copy.deepcopy(hf_model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * scale)
    return draft


def arch_of(hf_model):
    """Our ArchConfig for a tiny transformers model (through the loader's config.json path)."""
    from speculant.loader.hf_loader import arch_from_hf_config

    return arch_from_hf_config(hf_model.config.to_dict())


class TinyCheckpoint:
    """What `speculant.loader.load_checkpoint` returns, for a model built in the test."""

    def __init__(self, hf_model, tokenizer=None):
        self.arch = arch_of(hf_model)
        self.weights = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
        self.tokenizer = tokenizer
        self.path = None


def tiny_llm(hf_model, draft_hf_model=None, **kwargs):
    """An LLM over a tiny model (and tiny draft), with small pages so sequences span several."""
    from speculant import LLM

    kwargs.setdefault("page_size", 4)
    kwargs.setdefault("num_pages", 256)
    if draft_hf_model is not None:
        kwargs.setdefault("speculative", "draft")
        kwargs.setdefault("draft_model", "tiny-draft")
        kwargs["draft_checkpoint"] = TinyCheckpoint(draft_hf_model)
    return LLM(model="tiny", checkpoint=TinyCheckpoint(hf_model), **kwargs)


def chi_square_pvalue(
    samples: torch.Tensor,  # [n] int64 cell ids
    probs: torch.Tensor,  # [C] expected cell probabilities
) -> float:
    """Pearson goodness of fit; cells expecting < 5 counts are pooled into one; a sample in a
    zero-probability cell gives 0."""
    observed = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    impossible = expected == 0
    if observed[impossible].sum() > 0:
        return 0.0  # a sample the law forbids
    small = (expected < 5) & ~impossible
    observed = torch.cat([observed[~small & ~impossible], observed[small].sum()[None]])
    expected = torch.cat([expected[~small & ~impossible], expected[small].sum()[None]])
    if expected[-1] == 0:  # nothing was pooled
        observed, expected = observed[:-1], expected[:-1]
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor((expected.numel() - 1) / 2, dtype=torch.float64)
    return torch.special.gammaincc(dof, stat / 2).item()  # chi2 survival function


def ancestor_mask(parents: list[int]) -> np.ndarray:  # [n, n] bool
    """A draft tree's attention mask: node i sees itself and its ancestors (parent -1 = root)."""
    mask = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask
