"""Sampling and speculative verification: pure functions of (logits or probs, parameters, generators)."""

from speculant.sampling.acceptance import AcceptResult, accept_drafts, pad_ragged
from speculant.sampling.params import SamplingParams
from speculant.sampling.sampler import SamplingTensors, processed_probs, sample, token_logprobs

__all__ = [
    "AcceptResult",
    "SamplingParams",
    "SamplingTensors",
    "accept_drafts",
    "pad_ragged",
    "processed_probs",
    "sample",
    "token_logprobs",
]
