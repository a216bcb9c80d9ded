"""speculant: an LLM inference engine built around speculative decoding."""

from __future__ import annotations

from speculant.sampling.params import SamplingParams, StructuredOutput

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutput", "__version__"]


def __getattr__(name: str):
    if name == "LLM":  # imported lazily: `import speculant` stays light
        from speculant.llm import LLM

        return LLM
    raise AttributeError(name)
