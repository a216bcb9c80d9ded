"""Proposers by method name, imported lazily. The only place a method name is looked up."""

from __future__ import annotations

import importlib

from speculant.speculative.base import NoProposer, Proposer, ProposerContext

_PROPOSERS = {
    "draft": "speculant.speculative.draft_model:DraftModelProposer",
    "ngram": "speculant.speculative.ngram:NgramProposer",
    "mtp": "speculant.speculative.mtp:MtpProposer",
    "eagle": "speculant.speculative.eagle:EagleProposer",
}


def available_methods() -> list[str]:
    return ["none"] + sorted(_PROPOSERS)


def create_proposer(ctx: ProposerContext) -> Proposer:
    method = ctx.speculative.method
    if method == "none":
        return NoProposer(ctx)
    if method not in _PROPOSERS:
        raise ValueError(f"speculative must be one of {available_methods()}, got {method!r}")
    module_name, cls_name = _PROPOSERS[method].split(":")
    return getattr(importlib.import_module(module_name), cls_name)(ctx)
