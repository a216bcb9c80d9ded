"""One frozen configuration tree, built once from the CLI or the Python API.

`EngineConfig` holds what the user chose (`ModelConfig`, `CacheConfig`, `SchedulerConfig`,
`SpeculativeConfig`); `ArchConfig` holds what a checkpoint says about its architecture. Derived values are
properties; nothing mutates a config after construction (use `dataclasses.replace`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_MODES = ("auto", "fp32", "bf16", "int8", "int4")


def option(default: Any, help: str = "", **metadata: Any) -> Any:
    """A config field with what `config_options` needs to make it an `LLM` keyword and a CLI flag:
    `help`, and optionally `name`, `flag`, `cli_scale`, `choices` (see `speculant.config_options`).
    A name a registry looks up (`attention_backend`, `speculative`) stays a plain string here: the
    registries sit above this module, and `config_options` attaches their names as choices."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True)
class RopeScaling:
    """Rope scaling: Llama 3's ("llama3"), linear, or YaRN ("yarn", DeepSeek-V3: beta_*, mscale*);
    `kind="none"` means plain RoPE."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0  # YaRN: rotations below which a dimension is interpolated
    beta_slow: float = 1.0  # YaRN: rotations above which a dimension is kept
    mscale: float = 1.0  # YaRN: cos/sin carry mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    mscale_all_dim: float = 0.0  # YaRN: DeepSeek-V3 scales attention logits by mscale(factor, this) ** 2


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): per token the cache holds the latent c_kv
    [kv_lora_rank] and one shared RoPE key [qk_rope_head_dim]."""

    kv_lora_rank: int
    q_lora_rank: int | None  # None: a plain q projection
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True  # checkpoint's RoPE dims in (x0, x1) pairs; permuted on load

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoeConfig:
    """DeepSeek-V3 mixture of experts: sigmoid scores, grouped top-k over bias-corrected scores,
    shared experts; the first `first_dense_layers` layers keep a dense MLP."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    first_dense_layers: int = 0


@dataclass(frozen=True)
class GenerationDefaults:
    """The sampling defaults a checkpoint ships (`generation_config.json`); a request that leaves
    them unset gets these (None: the engine's own default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None

    def sampling_overrides(self) -> dict[str, float | int]:
        """The fields that are set, as `SamplingParams` keywords."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ArchConfig:
    """Architecture of a checkpoint: the Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5), its
    variants (Qwen3, Gemma 3, Phi-3: the fields below the EOS ids), or DeepSeek-V3 (`mla` and
    `moe` set)."""

    family: str  # "llama" | "qwen2" | "mistral" | "qwen3" | "gemma3" | "phi3" | "deepseek_v3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    bos_token_id: int | None = None
    eos_token_id: int | None = None  # the first end-of-sequence id the checkpoint names
    eos_token_ids: tuple[int, ...] = ()  # every id that ends generation: config lists, generation_config.json, GGUF eos/eot/eom
    generation: GenerationDefaults = GenerationDefaults()
    # Per-family differences of the Llama-shaped decoder (defaults: Llama's; `speculant.models.variants`).
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # the gate's activation: "silu", or "gelu_tanh" (Gemma)
    sandwich_norms: bool = False  # norms on the attention and MLP outputs, and before the MLP (Gemma 2/3)
    norm_weight_offset: float = 0.0  # RMSNorms scale by offset + weight (Gemma: 1)
    embed_scale: float = 1.0  # input embeddings times this (Gemma: sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma); None: head_dim's
    final_logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included
    sliding_layers: tuple[int, ...] = ()  # the layers that attend within `sliding_window`
    local_rope_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3); None: rope_theta
    mla: MlaConfig | None = None  # DeepSeek-V3 attention (num_heads, and head_dim = the RoPE dims)
    moe: MoeConfig | None = None  # DeepSeek-V3 experts
    mtp_layers: int = 0  # MTP modules the checkpoint keeps after its last layer (DeepSeek-V3)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def is_llama_layer(self) -> bool:
        """Every variant field at Llama's value: the plain Llama decoder layer runs it."""
        plain = ArchConfig(self.family, 1, 1, 1, 1, 1, 1, 1)
        fields = ("qk_norm", "hidden_act", "sandwich_norms", "norm_weight_offset", "embed_scale", "query_pre_attn_scalar", "final_logit_softcap", "sliding_layers")
        return all(getattr(self, f) == getattr(plain, f) for f in fields)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """The ids that end a request (unless it asks `ignore_eos`)."""
        first = () if self.eos_token_id is None else (self.eos_token_id,)
        return frozenset((*first, *self.eos_token_ids))

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class ModelConfig:
    """Which checkpoint to run and how: a registry name, a HF folder or a .gguf file."""

    model: str = option("smollm2-135m", "registry name, HF folder or .gguf file")
    dtype: str = option("float32", "the model's weights and activations", choices=tuple(_DTYPES))
    device: str = option("cpu", "torch device, e.g. cpu or cuda:0")
    attention_backend: str = option("auto", "auto: flashinfer on CUDA in fp16/bf16 when installed")
    seed: int = option(0, "engine seed for requests without their own")
    weights: str = option(
        "auto",
        "linear weights: auto keeps a quantized GGUF quantized (float checkpoints stay in dtype), fp32 dense in dtype (the reference), bf16 dense, int8/int4 quantized on load",
        choices=_WEIGHT_MODES,
    )

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.weights not in _WEIGHT_MODES:
            raise ValueError(f"weights must be one of {list(_WEIGHT_MODES)}, got {self.weights!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: pages of `page_size` token slots, shared by every model of the engine."""

    page_size: int = option(16, "token slots per KV page")
    kv_cache_bytes: int = option(1 << 30, "K/V budget of all models together", flag="--kv-cache-mb", cli_scale=1 << 20)
    num_pages: int | None = option(None, "KV page count, overriding both budgets")
    memory_budget: float | None = option(
        None,
        "bytes for everything the engine holds (weights, K/V, workspaces), or a fraction in (0, 1] of "
        "the free device memory at start-up; the KV cache gets what the memory plan leaves "
        "(overrides kv_cache_bytes)",
    )

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.memory_budget is not None and not self.memory_budget > 0:
            raise ValueError(f"memory_budget must be bytes (> 1) or a fraction in (0, 1], got {self.memory_budget}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching: how many sequences and tokens one step may hold."""

    max_num_seqs: int = option(64, "sequences running together")
    max_num_batched_tokens: int = option(512, "per-step token budget; longer prompts are prefilled in chunks")
    max_waiting: int = option(1024, "admission queue bound (the server answers 429 beyond it)")
    overlap: bool = option(
        False, "prepare step N+1's batch (pages for the most tokens step N may emit) while step N's forwards run in a worker thread"
    )

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")


@dataclass(frozen=True)
class DraftModelConfig:
    """Draft-target speculation: the small LLM that proposes tokens."""

    model: str | None = option(None, "draft registry name, HF folder or .gguf file (the target's vocabulary)")
    sampling: str = option("greedy", "greedy: the draft's argmax (one-hot); sample: draw from the draft", choices=("greedy", "sample"))
    dtype: str | None = option(None, "the draft's dtype (None: the target's); bfloat16 speeds a CPU draft", choices=tuple(_DTYPES))
    weights: str | None = option(
        None, "the draft's linear weights, as --weights (None: the target's)", choices=_WEIGHT_MODES,
    )
    window: int | None = option(
        None,
        "the draft reads only the first 4 prompt tokens and the last N (then every generated one): a long "
        "prompt's draft prefill costs N tokens; drafts stay proposals the target verifies (None: the whole prompt)",
    )

    def __post_init__(self) -> None:
        if self.sampling not in ("greedy", "sample"):
            raise ValueError(f"draft_sampling must be 'greedy' or 'sample', got {self.sampling!r}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"draft_dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.weights is not None and self.weights not in _WEIGHT_MODES:
            raise ValueError(f"draft_weights must be one of {list(_WEIGHT_MODES)}, got {self.weights!r}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"draft_window must be >= 1 (or None for the whole prompt), got {self.window}")

    def model_config(self, target: ModelConfig) -> ModelConfig:
        """The draft's ModelConfig: the target's (device, attention backend) with the draft's
        model, and its dtype and weights mode where set."""
        return dataclasses.replace(target, model=self.model, dtype=self.dtype or target.dtype, weights=self.weights or target.weights)


@dataclass(frozen=True)
class NgramConfig:
    """Prompt-lookup speculation: match the last n tokens, n from `max_n` down to `min_n`."""

    max_n: int = option(4, "longest suffix matched by n-gram lookup")
    min_n: int = option(1, "shortest suffix matched by n-gram lookup")
    store_tokens: int = option(65536, "tokens of recent finished outputs kept for cross-request matching, per engine (0 disables)")
    share_store: bool = option(
        False,
        "match every user's stored outputs, not only the request's own user's: faster on shared templates, "
        "but speculation speed then depends on other users' text (a timing side channel)",
    )

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"ngram_min_n and ngram_max_n must satisfy 1 <= min <= max, got {self.min_n}, {self.max_n}")
        if self.store_tokens < 0:
            raise ValueError(f"ngram_store_tokens must be >= 0, got {self.store_tokens}")


@dataclass(frozen=True)
class HeadConfig:
    """MTP / EAGLE speculation: a draft head on the target's hidden states."""

    path: str | None = option(None, "draft head folder (head.json + head.safetensors); None: the head shipped for the target", name="head")
    sampling: str = option("greedy", "greedy: the head's argmax (one-hot); sample: draw from the head", choices=("greedy", "sample"))
    lookup: int = option(
        3,
        "MTP chains: where the sequence's last n >= head_lookup tokens occurred before (n up to ngram_max_n), "
        "draft what followed them instead of the head's tokens (prompt lookup: copies cost no head forward); "
        "0: the head alone (EAGLE trees always)",
    )

    def __post_init__(self) -> None:
        if self.sampling not in ("greedy", "sample"):
            raise ValueError(f"head_sampling must be 'greedy' or 'sample', got {self.sampling!r}")
        if self.lookup < 0:
            raise ValueError(f"head_lookup must be >= 0 (0: no prompt lookup), got {self.lookup}")


TREE_SHAPES = ("dynamic", "static")


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE tree speculation: the shape of the draft tree a head grows each step (its node
    count is `num_draft_tokens`)."""

    shape: str = option("dynamic", "dynamic: expand the best frontier nodes by cumulative draft log-probability, rerank (EAGLE-2); static: fixed child choices (EAGLE)", name="tree", choices=TREE_SHAPES)
    depth: int = option(5, "tree depth: draft levels below the last verified token")
    topk: int = option(4, "children per expanded node (dynamic: also frontier nodes expanded per level)")
    auto_budget: bool = option(
        False,
        "choose each step's node count (num_draft_tokens the most; 0: a plain step) that maximises expected tokens/s, "
        "from the verify cost measured at start-up and the measured acceptance (always on with adaptive_k)",
    )

    def __post_init__(self) -> None:
        if self.shape not in TREE_SHAPES:
            raise ValueError(f"tree must be one of {list(TREE_SHAPES)}, got {self.shape!r}")
        if self.depth < 1 or self.topk < 1:
            raise ValueError(f"tree_depth and tree_topk must be >= 1, got {self.depth}, {self.topk}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding. `method` names a proposer in `speculant.speculative` ("none" disables
    it); each method's own settings live in its nested config."""

    method: str = option("ngram", "speculative method (none disables it); with adaptive_k it drafts only where that pays", name="speculative")
    num_draft_tokens: int = option(4, "k: tokens proposed per sequence per step (requests may override it)")
    adaptive_k: bool = option(
        True,
        "choose each request's k every step (0 = plain decoding) from its measured acceptance and the "
        "measured step cost; num_draft_tokens is then the upper bound",
    )
    draft: DraftModelConfig = DraftModelConfig()
    ngram: NgramConfig = NgramConfig()
    head: HeadConfig = HeadConfig()
    tree: TreeConfig = TreeConfig()

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.method == "draft" and not self.draft.model:
            raise ValueError("speculative='draft' needs draft_model")
        if self.method == "mtp" and self.head.lookup > self.ngram.max_n:
            raise ValueError(f"head_lookup ({self.head.lookup}) is longer than the longest suffix matched, ngram_max_n ({self.ngram.max_n})")
        if self.method == "eagle" and self.head.sampling == "sample" and self.tree.shape == "dynamic":
            raise ValueError(
                "head_sampling='sample' needs tree='static': a dynamic tree keeps children by their "
                "sampled values, so they would no longer follow the head's law"
            )

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism: the target (and any draft head) sharded over `tensor_parallel_size`
    ranks; a draft LLM, the scheduler and the page allocator live on rank 0 only."""

    tensor_parallel_size: int = option(1, "ranks the target is sharded over (workers started by the engine, or by torchrun)")
    worker_timeout_s: float = option(20.0, "seconds the leader waits for a tensor-parallel worker in a collective before it fails")

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not self.worker_timeout_s > 0:
            raise ValueError(f"worker_timeout_s must be > 0, got {self.worker_timeout_s}")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = ModelConfig()
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    speculative: SpeculativeConfig = SpeculativeConfig()
    parallel: ParallelConfig = ParallelConfig()

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)
