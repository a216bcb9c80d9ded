"""speculant: an LLM inference engine built around speculative decoding."""

from __future__ import annotations

from speculant.utils.threads import prepare_openmp

prepare_openmp()  # before anything imports torch: GNU OpenMP reads its settings once, at load

from speculant.sampling.params import SamplingParams, StructuredOutput  # noqa: E402

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutput", "__version__"]


def __getattr__(name: str):
    if name == "LLM":  # imported lazily: `import speculant` stays light
        from speculant.llm import LLM

        return LLM
    raise AttributeError(name)
