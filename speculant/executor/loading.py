"""Build model runners from checkpoints (the target's, and any draft model's), and check a model
a proposer declares (`ModelSpec`) against the model it serves: a draft LLM's vocabulary, a
head's target, hidden size and feature layers. The executor owns what these build; it loads
nothing itself."""

from __future__ import annotations

import functools
import weakref
from types import SimpleNamespace

import torch

from speculant.attention.base import AttentionBackend
from speculant.attention.registry import create_backend, resolve_backend_name
from speculant.config import EngineConfig, ModelConfig
from speculant.executor.model_runner import ModelRunner
from speculant.executor.plan import ModelSpec
from speculant.models.head_features import check_feature_layers
from speculant.models.registry import create_model

# Loaded models by (checkpoint, device, dtype, weights mode), while some engine holds them: engines
# built from one checkpoint object (`speculant bench`'s one engine per method) share its weights
# instead of each widening, quantizing and packing its own copy. A model holds only weights.
_LOADED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def build_runner(checkpoint, model_config: ModelConfig) -> ModelRunner:
    device, dtype = torch.device(model_config.device), model_config.torch_dtype
    key = (id(checkpoint), str(device), dtype, model_config.weights)
    model = _LOADED.get(key)
    if model is None or model.loaded_from() is not checkpoint:  # an id reused by another checkpoint
        model = create_model(checkpoint.arch, device, dtype, model_config.weights)
        model.load_weights(checkpoint.weights)
        model.loaded_from = weakref.ref(checkpoint)
        _LOADED[key] = model
    return ModelRunner(model, backend_for(model, model_config), device, dtype)


def build_head_runner(head, base: ModelRunner, model_config: ModelConfig) -> ModelRunner:
    """A draft head (`speculant.loader.head_file.HeadCheckpoint`) over `base`'s embedding and lm_head."""
    from speculant.models.draft_head import DraftHead

    device, dtype = base.device, base.dtype
    model = DraftHead(base.model, head.config.variant, head.weights, device, dtype, model_config.weights)
    return ModelRunner(model, backend_for(model, model_config), device, dtype)


def backend_for(model, model_config: ModelConfig) -> AttentionBackend:
    """The configured attention backend, or for "auto" the first the model runs on (MLA models
    run on the torch reference only)."""
    device, dtype, asked = torch.device(model_config.device), model_config.torch_dtype, model_config.attention_backend
    name = resolve_backend_name(asked, device, dtype)
    allowed = model.attention_backends
    if allowed is not None and name not in allowed:
        if asked != "auto":
            raise ValueError(f"attention_backend {asked!r}: the {model.arch.family} model runs on {list(allowed)}")
        name = allowed[0]
    return create_backend(name, device, dtype)


def load_checkpoint_for(name: str, model_config: ModelConfig):
    from speculant.loader import load_checkpoint

    return load_checkpoint(name, dtype=model_config.torch_dtype, keep_quantized=model_config.weights in ("auto", "int8", "int4"))


def load_target(config: EngineConfig, checkpoint=None):
    """(runner, tokenizer, sha256) for the target; `checkpoint` skips loading (tests pass tiny
    models). `sha256()` is the checkpoint's, computed when first asked (heads check it)."""
    from speculant.loader.head_file import checkpoint_sha256

    checkpoint = checkpoint or load_checkpoint_for(config.model.model, config.model)
    runner = build_runner(checkpoint, config.model)
    # A file's path, not its weights (which the model may have replaced); an in-memory
    # checkpoint (tests) is hashed from its tensors.
    source = SimpleNamespace(path=checkpoint.path) if checkpoint.path is not None else checkpoint
    sha256 = functools.partial(checkpoint_sha256, source)
    return runner, checkpoint.tokenizer, sha256


def load_model_runner(spec: ModelSpec, target_vocab: int) -> ModelRunner:
    """The runner of a declared model that is not a head (a draft LLM), its vocabulary checked
    against the target's (`target_vocab` tokens) when it must share it."""
    checkpoint = spec.checkpoint if spec.checkpoint is not None else load_checkpoint_for(spec.config.model, spec.config)
    vocab = checkpoint.arch.vocab_size
    if spec.shares_vocab and vocab != target_vocab:
        raise ValueError(
            f"{spec.name} model {spec.config.model!r} has a vocabulary of {vocab} tokens, "
            f"the target {target_vocab}: {spec.name} and target must share a vocabulary"
        )
    return build_runner(checkpoint, spec.config)


def own_head_runner(base: ModelRunner, model_config: ModelConfig) -> ModelRunner:
    """The base checkpoint's own MTP layer as a head: trained with it, nothing to check."""
    from speculant.loader.head_file import own_mtp_head

    return build_head_runner(own_mtp_head(base.model.own_head_weights(), base.arch.hidden_size), base, model_config)


def checked_head(spec: ModelSpec, base: ModelRunner, expect_sha256: str | None):
    """The head folder's (or in-memory) `HeadCheckpoint`, checked against its base model: its
    hidden size, its feature layers (an eagle3 head's, within the model's layers), and the target
    it was trained for when `expect_sha256` (the target checkpoint's) is given."""
    from speculant.loader.head_file import check_target, load_head

    head = spec.checkpoint if spec.checkpoint is not None else load_head(spec.config.model, expect_sha256)
    if expect_sha256 is not None:
        check_target(head.config, expect_sha256, head.path or spec.config.model)
    if head.config.hidden_size != base.arch.hidden_size:
        raise ValueError(
            f"head {spec.config.model!r} has hidden size {head.config.hidden_size}, "
            f"the {spec.head_of} model {base.arch.hidden_size}"
        )
    if head.config.feature_layers:
        check_feature_layers(head.config.feature_layers, base.arch.num_layers)
    return head
