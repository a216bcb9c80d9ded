"""Test kit: tiny random Hugging Face models that the tests build themselves, and statistics.

Import as `from testkit import ...` (tests/ is on sys.path through tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import torch


def tiny_hf_config(kind: str = "llama", vocab_size: int = 256, **overrides):
    """A small transformers config of the given kind: "llama", "qwen2" (q/k/v bias), "tied",
    "qwen3" (q/k norms), "gemma3" (sliding window 6 on layers 0 and 2, its own RoPE base there,
    query_pre_attn_scalar 24, soft-capped logits) or "phi3" (fused products)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen2Config, Qwen3Config

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
    if kind == "qwen2":
        return Qwen2Config(**{**common, "tie_word_embeddings": False, "rope_theta": 10000.0, **overrides})
    default_rope = {"rope_type": "default", "rope_theta": 10000.0}
    if kind == "qwen3":
        return Qwen3Config(**{**common, "tie_word_embeddings": False, "head_dim": 24, "rope_parameters": default_rope, **overrides})
    if kind == "phi3":
        return Phi3Config(**{**common, "tie_word_embeddings": False, "rope_parameters": default_rope, **overrides})
    if kind == "gemma3":
        rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
        gemma = dict(head_dim=16, num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=6,
                     query_pre_attn_scalar=24, final_logit_softcapping=5.0, rope_parameters=rope, tie_word_embeddings=True)  # fmt: skip
        return Gemma3TextConfig(**{**common, **gemma, **overrides})
    return LlamaConfig(**{**common, "tie_word_embeddings": kind == "tied", **overrides})


def tiny_hf_model(kind: str = "llama", seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_deepseek_config(**overrides) if kind == "deepseek" else tiny_hf_config(kind, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random init has tiny weights; widen them so logits are not all near-ties
        for p in model.parameters():
            p.normal_(0, 0.08 if p.dim() > 1 else 0.3).add_(1.0 if p.dim() == 1 else 0.0)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a load-balancing bias that changes choices
                b.normal_(0, 0.1)
    return model.eval()


def tiny_deepseek_config(vocab_size: int = 256, **overrides):
    """A small DeepSeek-V3: MLA with q LoRA (`q_lora_rank=None`: a plain q projection), one dense
    layer then MoE layers (8 experts in 4 groups, 2 groups kept, 3 experts a token, a shared
    expert), YaRN RoPE with DeepSeek's mscale, interleaved RoPE dims."""
    from transformers import DeepseekV3Config

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=24, n_routed_experts=8, n_shared_experts=1,
        n_group=4, topk_group=2, num_experts_per_tok=3, first_k_dense_replace=1, routed_scaling_factor=2.5,
        max_position_embeddings=512, rms_norm_eps=1e-5, num_mtp_layers=0, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
            "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
        },
    )
    common.update(overrides)
    return DeepseekV3Config(**common)


def with_mtp_layer(hf_model, seed: int = 5) -> TinyCheckpoint:
    """A TinyCheckpoint of a tiny DeepSeek-V3 plus a random MTP module at layer index
    num_hidden_layers (enorm, hnorm, eh_proj, a full MoE decoder layer, shared_head.norm), the way
    DeepSeek-V3 checkpoints store it."""
    import dataclasses

    config = hf_model.config
    n, h = config.num_hidden_layers, config.hidden_size
    donor = tiny_hf_model("deepseek", seed=seed, **{**_overrides_of(config), "num_hidden_layers": n + 1})
    g = torch.Generator().manual_seed(seed)
    ckpt = TinyCheckpoint(hf_model)
    p = f"model.layers.{n}."
    ckpt.weights |= {k: v.detach().clone() for k, v in donor.state_dict().items() if k.startswith(p)}
    ckpt.weights |= {
        p + "enorm.weight": 1 + 0.3 * torch.randn(h, generator=g),
        p + "hnorm.weight": 1 + 0.3 * torch.randn(h, generator=g),
        p + "eh_proj.weight": 0.08 * torch.randn(h, 2 * h, generator=g),
        p + "shared_head.norm.weight": 1 + 0.3 * torch.randn(h, generator=g),
    }
    ckpt.arch = dataclasses.replace(ckpt.arch, mtp_layers=1)
    return ckpt


def _overrides_of(config) -> dict:
    keys = ("q_lora_rank", "num_hidden_layers", "first_k_dense_replace")
    return {k: getattr(config, k) for k in keys}


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
        from speculant.loader.fused import split_fused

        self.arch = arch_of(hf_model)
        self.weights = split_fused({k: v.detach().clone() for k, v in hf_model.state_dict().items()}, self.arch)
        self.tokenizer = tokenizer
        self.path = None


def tiny_llm(hf_model, draft_hf_model=None, **kwargs):
    """An LLM over a tiny model (and tiny draft), with small pages so sequences span several.

    k is fixed unless a test asks for adaptive k: on a tiny model the host's planning is a large
    share of a step, so adaptive k may rightly decide not to draft at all on a slow machine, and
    a test of a proposer must see it draft."""
    from speculant import LLM

    kwargs.setdefault("adaptive_k", False)
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


def target_states(hf_model, sequences: list[list[int]], feature_layers: tuple[int, ...] = ()):
    """[(hidden [T, H] before the final norm, logits [T, V])] of the tiny target over each
    sequence, through the engine's own executor; with `feature_layers`, hidden [T, 3H] those
    layers' outputs (what an eagle3 head reads)."""
    from speculant.attention.batch import SeqInput
    from speculant.config import ModelConfig
    from speculant.executor.executor import Executor
    from speculant.executor.loading import build_runner
    from speculant.executor.plan import TARGET, ForwardPlan

    executor = Executor(build_runner(TinyCheckpoint(hf_model), ModelConfig(model="tiny")))
    if feature_layers:
        executor.expose_features(TARGET, feature_layers)
    longest = max(len(s) for s in sequences)
    executor.allocate_kv(num_pages=longest // 16 + 1, page_size=16)
    out = []
    for s in sequences:
        result = executor.run(ForwardPlan(TARGET, [SeqInput(s, 0, list(range(longest // 16 + 1)), logits="all")]))
        out.append((result.hidden, result.logits))
    return out


def fit_head(hf_model, sequences: list[list[int]], variant: str = "normed", steps: int = 300, seed: int = 0, vocab_map=None):
    """A draft head for the tiny target fitted to its own next-token laws on `sequences` (entry i
    reads h_i and t_{i+1}, learns the target's law at i+1): a `HeadCheckpoint` for the engine.
    An eagle3 head reads the target's default feature layers and fits its own lm_head too."""
    import torch.nn.functional as F

    from speculant.layers.rotary import RotaryEmbedding
    from speculant.loader.head_file import HeadCheckpoint, HeadFileConfig, checkpoint_sha256
    from speculant.models.head import (
        build_modules,
        head_arch,
        head_forward,
        head_logits,
        init_head_weights,
    )
    from speculant.models.head_features import FEATURE_VARIANT, default_feature_layers

    ckpt = TinyCheckpoint(hf_model)
    arch = head_arch(ckpt.arch)
    embed, lm_head = ckpt.weights["model.embed_tokens.weight"], ckpt.weights.get("lm_head.weight", ckpt.weights["model.embed_tokens.weight"])
    rows = lm_head if vocab_map is None else lm_head[vocab_map]  # an eagle3 head's own lm_head starts here
    weights = {k: v.requires_grad_() for k, v in init_head_weights(arch, variant, seed, std=0.05, lm_head=rows).items()}
    rotary = RotaryEmbedding(arch, torch.device("cpu"), torch.float32)
    layers = default_feature_layers(ckpt.arch.num_layers) if variant == FEATURE_VARIANT else ()
    states = target_states(hf_model, sequences, layers)
    data = [(torch.tensor(s), h.detach(), lg.detach()) for s, (h, lg) in zip(sequences, states)]
    opt = torch.optim.Adam(list(weights.values()), lr=3e-3)

    def attend(q, k, v):
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    for _ in range(steps):
        opt.zero_grad()
        loss = 0.0
        for tokens, hidden, logits in data:
            n = len(tokens) - 1
            m = build_modules(weights, arch, variant)
            cos, sin = rotary.lookup(torch.arange(n))
            out = head_forward(arch, m, F.embedding(tokens[1:], embed), hidden[:n], cos, sin, attend)
            pred = head_logits(arch, m, out, lm_head, vocab_map)  # entry i predicts the law at i + 1
            target = torch.softmax(logits[1:], -1)
            if vocab_map is not None:
                target = target[:, vocab_map]
            loss = loss + F.cross_entropy(pred, target)
        loss.backward()
        opt.step()
    final = {k: v.detach() for k, v in weights.items()}
    if vocab_map is not None:
        final["vocab_map"] = vocab_map
    cfg = HeadFileConfig(variant, "tiny", checkpoint_sha256(ckpt), arch.hidden_size, 0 if vocab_map is None else len(vocab_map), feature_layers=layers)
    return HeadCheckpoint(cfg, final)


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def greedy_params(max_tokens: int = 24):
    from speculant import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


# prompts of several lengths, repeats included, for greedy-equality tests of speculation
MIXED_PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], list(range(50, 61)), [9, 9, 9, 9], list(range(100, 117)), [7, 1], list(range(60, 68))]


CHAIN_METHODS = {  # engine options of every chain method, for per-method decode-step checks
    "plain": {},
    "ngram": {"speculative": "ngram"},
    "draft-greedy": {"speculative": "draft", "num_draft_tokens": 3},
    "draft-sampled": {"speculative": "draft", "num_draft_tokens": 3, "draft_sampling": "sample"},
}


def strict_decode_step(llm, prompts: list[list[int]], params: list) -> tuple[int, int]:
    """Submit the requests, step until each has a token, then take one decode step in strict sync
    mode under the device-mixing check: (host reads of that step, draft steps it added)."""
    from speculant.utils import sync
    from speculant.utils.device_check import device_check

    for prompt, p in zip(prompts, params):
        llm.engine.add_request(prompt, p)
    while not all(r.output_token_ids for r in llm.engine.requests.values()):
        llm.engine.step()
    drafted = llm.engine.stats.spec_stats.draft_steps
    with sync.strict_sync(), device_check():
        before = sync.host_reads()
        llm.engine.step()
        reads = sync.host_reads() - before
    return reads, llm.engine.stats.spec_stats.draft_steps - drafted


def record_drafts_and_head_rows(llm, monkeypatch, model: str = "head") -> tuple[list, list]:
    """Spy on a speculative engine as it runs: (each step's proposed token ids as lists, the
    rows of each forward of `model`, the executor's name of the head)."""
    engine, drafts, rows = llm.engine, [], []
    run, propose = engine.executor.run, engine.proposer.propose

    def counted_run(plan):
        if plan.model == model:
            rows.append(sum(len(s.token_ids) for s in plan.inputs))
        return run(plan)

    def recorded_propose(batch):
        proposal = yield from propose(batch)
        drafts.append(proposal.token_ids.tolist())
        return proposal

    monkeypatch.setattr(engine.executor, "run", counted_run)
    monkeypatch.setattr(engine.proposer, "propose", recorded_propose)
    return drafts, rows


def record_offer_kinds(owner, monkeypatch) -> list:
    """Spy on a proposer's `offer` (a proposer, or its class before one is built): the kind of
    every offer in order (None: the proposer's own drafts; a lookup's copies: their match key)."""
    kinds, offer = [], owner.offer

    def recorded(*args):
        n, kind = offer(*args)
        kinds.append(kind)
        return n, kind

    monkeypatch.setattr(owner, "offer", recorded)
    return kinds
