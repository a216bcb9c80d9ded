"""From a request body to the engine's `SamplingParams`, and admission errors back to the field
that caused them."""

from __future__ import annotations

from speculant.sampling.params import SamplingParams
from speculant.server.errors import APIError, bad_request, from_engine_error
from speculant.server.protocol import ChatCompletionRequest, CompletionRequest
from speculant.server.structured_fields import requested_structure
from speculant.server.tools import ToolRequest, tool_constraint

SAMPLING_FIELDS = {
    "max_tokens",
    "max_completion_tokens",
    "top_logprobs",
    "logprobs",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "num_draft_tokens",
    "logit_bias",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
}


def admission_error(exc: ValueError, body: CompletionRequest | ChatCompletionRequest, prompt_field: str) -> APIError:
    """A grammar the engine cannot compile is a 400 naming the request field that carried it."""
    message = str(exc)
    if message.startswith("structured_output"):
        field = requested_structure(body)[1] or "tools"
        return bad_request(field + message.removeprefix("structured_output"), field)
    return from_engine_error(exc, SAMPLING_FIELDS, prompt_field)


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's logit_bias keys are token ids written as text."""
    if not all(key.isdecimal() for key in bias):
        raise ValueError(f"logit_bias keys must be token ids, got {[k for k in bias if not k.isdecimal()][:3]}")
    return {int(key): value for key, value in bias.items()}


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest,
    max_tokens: int | None,
    logprobs: bool,
    top_logprobs: int,
    tools: ToolRequest | None = None,
    defaults: dict | None = None,
) -> SamplingParams:
    """`defaults`: the checkpoint's generation_config.json sampling fields, which stand in for
    the ones a request leaves unset (as vLLM does)."""
    chosen = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": max(body.top_k, 0) if body.top_k is not None else None,
        "min_p": body.min_p,
        "seed": body.seed,
        "stop": (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
        "num_draft_tokens": body.num_draft_tokens,
        "stop_token_ids": tuple(body.stop_token_ids) if body.stop_token_ids else None,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "repetition_penalty": body.repetition_penalty,
        "min_tokens": body.min_tokens,
        "max_tokens": max_tokens,
    }
    for field, value in (defaults or {}).items():  # temperature, top_p, top_k, min_p
        if chosen[field] is None:
            chosen[field] = value
    kwargs = {k: v for k, v in chosen.items() if v is not None}
    try:
        kwargs["structured_output"] = requested_structure(body)[0]
        constraint = tool_constraint(tools) if tools is not None else None
        if constraint is not None and kwargs["structured_output"] is not None:
            raise ValueError(f"tool_choice: {tools.choice!r} constrains the reply; drop {requested_structure(body)[1]} or use tool_choice 'none'")
        kwargs["structured_output"] = kwargs["structured_output"] or constraint
        kwargs["logit_bias"] = _logit_bias(body.logit_bias or {})
        return SamplingParams(
            **kwargs,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            ignore_eos=bool(body.ignore_eos),
        )
    except ValueError as exc:
        raise bad_request(str(exc), str(exc).split(" ", 1)[0].rstrip(":")) from None
